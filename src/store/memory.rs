//! Stores that keep their contents in this process, for tests: what a
//! crash leaves of a real store is exactly what its completed commits
//! wrote, and [`MemoryStore`] holds exactly that. [`FailingStore`] fails
//! on demand, for the paths that must answer `STORE_FAILED`.
//!
//! (`[store] backend = "memory"` uses no store at all: nothing is written.)

use std::{
    collections::BTreeMap,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
};

use parking_lot::Mutex;

use super::{Batch, Contents, Store, StoreError};
use crate::scheduler::durable::LogPosition;

#[derive(Debug, Default)]
struct Committed {
    agents: BTreeMap<u128, Vec<u8>>,
    events: BTreeMap<u64, Vec<u8>>,
    conversations: BTreeMap<u128, Vec<u8>>,
    position: LogPosition,
    commits: usize,
}

/// A store whose contents are what its completed commits wrote. Clones
/// share the contents, so a test can "restart" on the same store.
#[derive(Debug, Clone, Default)]
pub struct MemoryStore {
    committed: Arc<Mutex<Committed>>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Completed commits so far.
    pub fn commits(&self) -> usize {
        self.committed.lock().commits
    }
}

impl Store for MemoryStore {
    fn commit(&mut self, batch: &Batch) -> Result<(), StoreError> {
        let mut c = self.committed.lock();
        for (id, row) in &batch.agents {
            match row {
                Some(row) => c.agents.insert(id.as_u128(), row.clone()),
                None => c.agents.remove(&id.as_u128()),
            };
        }
        for (id, row) in &batch.conversations {
            match row {
                Some(row) => c.conversations.insert(id.as_u128(), row.clone()),
                None => c.conversations.remove(&id.as_u128()),
            };
        }
        for (seq, row) in &batch.events {
            c.events.insert(*seq, row.clone());
        }
        let through = batch.position.evicted_through;
        c.events.retain(|seq, _| *seq > through);
        c.position = batch.position;
        c.commits += 1;
        Ok(())
    }

    fn load(&mut self) -> Result<Contents, StoreError> {
        let c = self.committed.lock();
        Ok(Contents {
            agents: c.agents.values().cloned().collect(),
            events: c.events.iter().map(|(s, r)| (*s, r.clone())).collect(),
            position: c.position,
            conversations: c.conversations.values().cloned().collect(),
        })
    }

    fn describe(&self) -> String {
        "in-memory test store".to_owned()
    }
}

/// A [`MemoryStore`] whose commits fail once `fail_after` commits have
/// succeeded (a disk that fills up, an fsync that fails). A failed commit
/// writes nothing.
#[derive(Debug, Clone)]
pub struct FailingStore {
    inner: MemoryStore,
    fail_after: Arc<AtomicUsize>,
}

impl FailingStore {
    /// Fails every commit after the first `fail_after`.
    pub fn new(inner: MemoryStore, fail_after: usize) -> Self {
        Self {
            inner,
            fail_after: Arc::new(AtomicUsize::new(fail_after)),
        }
    }

    /// Changes when commits start failing (counted from now).
    pub fn fail_after(&self, commits: usize) {
        self.fail_after
            .store(self.inner.commits() + commits, Ordering::SeqCst);
    }
}

impl Store for FailingStore {
    fn commit(&mut self, batch: &Batch) -> Result<(), StoreError> {
        if self.inner.commits() >= self.fail_after.load(Ordering::SeqCst) {
            return Err(StoreError::Engine(
                "injected failure: the disk is full".to_owned(),
            ));
        }
        self.inner.commit(batch)
    }

    fn load(&mut self) -> Result<Contents, StoreError> {
        self.inner.load()
    }

    fn describe(&self) -> String {
        "failing test store".to_owned()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Arc;

    use std::time::{Duration, SystemTime};

    use uuid::Uuid;

    use super::*;
    use crate::scheduler::conversation::{row, ConversationId};
    use crate::{
        scheduler::{
            conversation::{Conversation, Conversations, EntryKind, Inherited},
            durable::{AgentState, ChangeSet},
            events::{Event, EventKind},
            AgentError, AgentStatus,
        },
        store::rows::tests::full_state,
    };

    fn event(seq: u64, state: &AgentState) -> Arc<Event> {
        Arc::new(Event::recovered(
            seq,
            EventKind::Queued,
            state.view.clone(),
            state.view.created_at,
        ))
    }

    /// A conversation of two turns, the second a continuation of the
    /// first, with an id from `n`.
    fn conversation(n: u128) -> Conversation {
        let first = Uuid::from_u128(n << 64);
        let second = Uuid::from_u128((n << 64) + 1);
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let mut all = Conversations::new(Duration::from_secs(60), 1 << 20);
        all.track_changes();
        let inherited = Inherited {
            agent: "simulated".into(),
            model: "p/m".into(),
            parent_id: None,
            lead_id: Some("lead".into()),
            labels: Default::default(),
        };
        all.begin(first, "t".into(), inherited.clone(), "first".into(), at);
        all.record(first, EntryKind::Steer, "more".into(), at);
        all.end(first, AgentStatus::Done, None, None, "one".into(), at);
        let from = all.continuable("t", first, false).unwrap().from;
        all.continue_with(from, second, inherited, "second".into(), at);
        all.set_session(second, "session-1".into());
        all.end(
            second,
            AgentStatus::Failed,
            Some(AgentError {
                code: "TIMEOUT".into(),
                message: "slow".into(),
            }),
            None,
            "partial".into(),
            at,
        );
        let (_, row) = all.take_changes().0.remove(0);
        row::decode(&row).unwrap()
    }

    /// What a change set carries for `c`.
    fn changed(c: &Conversation) -> (ConversationId, Vec<u8>) {
        let mut bytes = Vec::new();
        row::encode(c, &mut bytes);
        (c.id, bytes)
    }

    fn conversation_changed(n: u128) -> Conversation {
        let mut c = conversation(n);
        c.turns[1].entries.pop();
        c
    }

    fn commit(store: &mut dyn Store, changes: ChangeSet) {
        let mut batch = Batch::default();
        batch.add(&changes);
        store.commit(&batch).unwrap();
    }

    /// What every engine must do. `open` opens the same store again each
    /// time it is called (after the previous handle is dropped).
    pub(crate) fn conformance(open: impl Fn() -> Box<dyn Store>) {
        let empty = open().load().unwrap();
        assert!(empty.agents.is_empty() && empty.events.is_empty());
        assert_eq!(empty.position, LogPosition::default());

        let (a, b, c) = (full_state(1), full_state(2), full_state(3));
        {
            let mut store = open();
            commit(
                store.as_mut(),
                ChangeSet {
                    agents: vec![b.clone(), a.clone()],
                    events: vec![event(1, &a), event(2, &b)],
                    removed: vec![],
                    position: LogPosition {
                        last_sequence: 2,
                        evicted_through: 0,
                        next_admission: 3,
                    },
                    conversations: vec![changed(&conversation(1)), changed(&conversation(2))],
                    conversations_removed: vec![],
                },
            );
        }
        let got = open().load().unwrap().decode().unwrap();
        assert_eq!(got.agents, vec![a.clone(), b.clone()], "admission order");
        assert_eq!(
            got.events.iter().map(|e| e.sequence).collect::<Vec<_>>(),
            [1, 2]
        );
        assert_eq!(got.events[1].agent, b.view);
        assert_eq!(got.position.next_admission, 3);
        assert_eq!(got.conversations, vec![conversation(1), conversation(2)]);

        let mut a2 = a.clone();
        a2.view.result = "changed".into();
        let position = LogPosition {
            last_sequence: 5,
            evicted_through: 3,
            next_admission: 4,
        };
        {
            let mut store = open();
            commit(
                store.as_mut(),
                ChangeSet {
                    agents: vec![a2.clone(), c.clone()],
                    removed: vec![b.view.id],
                    events: vec![event(3, &c), event(4, &a2), event(5, &c)],
                    position,
                    conversations: vec![changed(&conversation_changed(2))],
                    conversations_removed: vec![conversation(1).id],
                },
            );
        }
        let got = open().load().unwrap().decode().unwrap();
        assert_eq!(got.agents, vec![a2, c.clone()]);
        assert_eq!(
            got.events.iter().map(|e| e.sequence).collect::<Vec<_>>(),
            [4, 5],
            "events up to evicted_through are gone"
        );
        assert_eq!(got.position, position);
        assert_eq!(
            got.conversations,
            vec![conversation_changed(2)],
            "a conversation is rewritten whole and a removed one is gone"
        );

        // Evictions by one handle, commit after commit (an engine may
        // remember where the previous one ended).
        let mut store = open();
        for (events, evicted_through) in [(vec![6, 7], 4), (vec![8], 6), (vec![], 7)] {
            let last_sequence = events.last().copied().unwrap_or(8);
            commit(
                store.as_mut(),
                ChangeSet {
                    events: events.into_iter().map(|s| event(s, &c)).collect(),
                    position: LogPosition {
                        last_sequence,
                        evicted_through,
                        next_admission: 4,
                    },
                    ..Default::default()
                },
            );
        }
        drop(store);
        let got = open().load().unwrap().decode().unwrap();
        assert_eq!(
            got.events.iter().map(|e| e.sequence).collect::<Vec<_>>(),
            [8],
            "each commit's eviction deletes what the previous one left"
        );
    }

    /// An engine migrates a store of schema version 1 and keeps its rows:
    /// `set_version` rewrites the recorded version (no store open), and
    /// `version` reads it back.
    pub(crate) fn migrates_from_version_1(
        open: impl Fn() -> Box<dyn Store>,
        set_version: impl Fn(u64),
        version: impl Fn() -> u64,
    ) {
        // What version 1 wrote: rows without the fields version 2 added.
        let mut a = full_state(1);
        a.decision = None;
        let position = LogPosition {
            last_sequence: 1,
            evicted_through: 0,
            next_admission: 2,
        };
        commit(
            open().as_mut(),
            ChangeSet {
                agents: vec![a.clone()],
                events: vec![event(1, &a)],
                removed: vec![],
                position,
                ..Default::default()
            },
        );
        set_version(1);
        assert_eq!(version(), 1);

        let got = open().load().unwrap().decode().unwrap();
        assert_eq!(version(), u64::from(crate::store::SCHEMA_VERSION));
        const { assert!(crate::store::SCHEMA_VERSION > 1) };
        assert_eq!(got.agents, vec![a.clone()]);
        assert_eq!(got.events.len(), 1);
        assert_eq!(got.events[0].agent, a.view);
        assert_eq!(got.position, position);
    }

    #[test]
    fn the_memory_store_keeps_what_each_commit_wrote() {
        let store = MemoryStore::new();
        conformance(|| Box::new(store.clone()));
    }

    #[test]
    fn a_failing_store_fails_when_told_and_keeps_only_what_succeeded() {
        let inner = MemoryStore::new();
        let mut store = FailingStore::new(inner.clone(), 1);
        let a = full_state(1);
        let mut batch = Batch::default();
        batch.add(&ChangeSet {
            agents: vec![a.clone()],
            ..Default::default()
        });
        store.commit(&batch).unwrap();
        let mut second = Batch::default();
        second.add(&ChangeSet {
            agents: vec![full_state(2)],
            ..Default::default()
        });
        let err = store.commit(&second).unwrap_err();
        assert!(matches!(err, StoreError::Engine(_)), "{err:?}");
        let got = inner.clone().load().unwrap().decode().unwrap();
        assert_eq!(got.agents, vec![a]);
        store.fail_after(1);
        store.commit(&second).unwrap();
        assert_eq!(inner.commits(), 2);
    }
}
