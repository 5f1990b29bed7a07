//! Durable state: the seam between the scheduler and a storage engine.
//!
//! The scheduler core never imports this module. It hands out
//! [`ChangeSet`]s in domain terms; a writer encodes each batch of them here
//! (off the core's lock) and commits it through a [`Store`], one
//! transaction and one fsync per batch. At start, recovery reads the
//! store's [`Contents`] and decodes them into a [`Recovered`] state.
//!
//! Engines only move bytes: the `agents` table (id → encoded row), the
//! `events` table (sequence → encoded event, trimmed to the watch history),
//! the `conversations` table (id → encoded conversation, written whole)
//! and a few counters. The encoding lives in [`rows`], once for every engine.

pub mod embedded;
pub mod memory;
pub mod postgres;
mod rows;
pub mod writer;

use std::{
    collections::{hash_map::Entry, HashMap},
    path::PathBuf,
};

use crate::config::{StoreBackend, StoreConfig};
use crate::scheduler::{
    conversation::ConversationId,
    durable::{ChangeSet, LogPosition, Recovered},
    AgentId,
};

/// The schema this build writes. Bump it with a migration in each engine
/// when the stored layout changes in a way old readers cannot skip.
///
/// - 1: agents, events and the log's counters.
/// - 2: an agent row may hold the approval decision its paused run waits
///   to receive, and a worker run's last applied report number. The tables
///   are unchanged and version 1 rows have neither, so the migration only
///   records the version; but a version 1 server would read a paused run
///   as an agent that never ran and start it afresh, so it must refuse the
///   store.
/// - 3: PostgreSQL gains the leader lease (`subagentd_lease`); the embedded
///   store is unchanged (it is single-server). A version 2 server would
///   ignore the lease and schedule beside the leader, so it must refuse
///   the database.
/// - 4: conversations: a `conversations` table (id → the conversation's
///   transcript and what its continuations inherit), and an agent row's
///   view may say which conversation and turn a continuation is. The
///   migration creates the table; older rows need no rewrite (an absent
///   continuation is the first turn of the conversation the agent's id
///   names). A version 3 server would ignore the transcripts, and its
///   retention would never remove them, so it must refuse the store.
pub const SCHEMA_VERSION: u32 = 4;

/// Why a store could not be opened, read or written.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Another process holds the store.
    #[error(
        "the store at {} is in use by another subagentd process (only one server may open it)",
        path.display()
    )]
    Locked {
        /// The store's path.
        path: PathBuf,
    },
    /// Another subagentd server uses the database (it holds the database's
    /// advisory lock).
    #[error(
        "the database {where_} is in use by another subagentd server (only one server may use it)"
    )]
    InUse {
        /// The database's URL, its password redacted.
        where_: String,
    },
    /// This server's leadership ended: another server took the lease, so
    /// the commit was rolled back and wrote nothing.
    #[error(
        "the store at {where_} is led by epoch {current:?} now, not this server's epoch {epoch}: \
         not committing (another server took over)"
    )]
    Deposed {
        /// The database's URL, its password redacted.
        where_: String,
        /// The epoch of this server's lease.
        epoch: u64,
        /// The epoch the database records (`None`: no lease row).
        current: Option<u64>,
    },
    /// The store was written by a newer subagentd.
    #[error(
        "the store at {where_} has schema version {found}, newer than this subagentd's {supported}: \
         run a subagentd at least as new as the one that wrote it"
    )]
    NewerSchema {
        /// Where the store is (a path or a database).
        where_: String,
        /// Version found in the store.
        found: u32,
        /// [`SCHEMA_VERSION`].
        supported: u32,
    },
    /// A row that does not decode: the store is damaged or not ours.
    #[error("the store holds a row that does not decode ({0})")]
    Corrupt(String),
    /// The engine failed (I/O, fsync, a lost connection): the outcome of
    /// a commit that fails this way is unknown.
    #[error("{0}")]
    Engine(String),
}

impl From<crate::scheduler::conversation::row::Corrupt> for StoreError {
    fn from(e: crate::scheduler::conversation::row::Corrupt) -> Self {
        StoreError::Corrupt(e.0)
    }
}

/// The encoded form of one or more change sets: what one commit writes.
#[derive(Debug, Default)]
pub struct Batch {
    /// Each changed agent once: its row as of the latest change set, or
    /// None when retention removed it.
    pub agents: Vec<(AgentId, Option<Vec<u8>>)>,
    /// Appended `events` rows, in sequence order.
    pub events: Vec<(u64, Vec<u8>)>,
    /// The counters after the batch; events up to `evicted_through` are
    /// deleted.
    pub position: LogPosition,
    /// Each changed conversation once: its row as of the latest change
    /// set, or None when retention removed it.
    pub conversations: Vec<(ConversationId, Option<Vec<u8>>)>,
    /// How many change sets went into it (for the group-commit figures).
    pub change_sets: usize,
    /// Where each agent is in `agents`.
    index: HashMap<AgentId, usize>,
    /// Where each conversation is in `conversations`.
    conversation_index: HashMap<ConversationId, usize>,
}

impl Batch {
    /// Adds a change set. Later ones win: an agent (or a conversation)
    /// changed in two change sets is written once, as it is after the
    /// second.
    pub fn add(&mut self, changes: &ChangeSet) {
        for state in &changes.agents {
            let row = Some(rows::encode_agent(state));
            latest(&mut self.agents, &mut self.index, state.view.id, row);
        }
        for id in &changes.removed {
            latest(&mut self.agents, &mut self.index, *id, None);
        }
        let (list, index) = (&mut self.conversations, &mut self.conversation_index);
        for (id, row) in &changes.conversations {
            latest(list, index, *id, Some(row.clone()));
        }
        for id in &changes.conversations_removed {
            latest(list, index, *id, None);
        }
        self.events.extend(
            changes
                .events
                .iter()
                .map(|e| (e.sequence, rows::encode_event(e))),
        );
        self.position = changes.position;
        self.change_sets += 1;
    }

    /// Whether the batch writes nothing.
    pub fn is_empty(&self) -> bool {
        self.change_sets == 0
    }
}

/// Sets `id`'s row in `rows` (found through `index`), replacing the one an
/// earlier change set of the batch put there.
fn latest(
    rows: &mut Vec<(uuid::Uuid, Option<Vec<u8>>)>,
    index: &mut HashMap<uuid::Uuid, usize>,
    id: uuid::Uuid,
    row: Option<Vec<u8>>,
) {
    match index.entry(id) {
        Entry::Occupied(at) => rows[*at.get()].1 = row,
        Entry::Vacant(slot) => {
            slot.insert(rows.len());
            rows.push((id, row));
        }
    }
}

/// What a store holds, still encoded.
#[derive(Debug, Default)]
pub struct Contents {
    /// Every `agents` row.
    pub agents: Vec<Vec<u8>>,
    /// Every `events` row, in sequence order.
    pub events: Vec<(u64, Vec<u8>)>,
    /// The counters as last committed.
    pub position: LogPosition,
    /// Every `conversations` row.
    pub conversations: Vec<Vec<u8>>,
}

impl Contents {
    /// Decodes everything; agents come back in admission order,
    /// conversations in id order.
    pub fn decode(self) -> Result<Recovered, StoreError> {
        let mut agents = self
            .agents
            .iter()
            .map(|row| rows::decode_agent(row))
            .collect::<Result<Vec<_>, _>>()?;
        agents.sort_unstable_by_key(|a| a.seq);
        let events = self
            .events
            .iter()
            .map(|(seq, row)| rows::decode_event(*seq, row))
            .collect::<Result<Vec<_>, _>>()?;
        let mut conversations = self
            .conversations
            .iter()
            .map(|row| rows::decode_conversation(row))
            .collect::<Result<Vec<_>, _>>()?;
        conversations.sort_unstable_by_key(|c| c.id);
        Ok(Recovered {
            agents,
            events,
            position: self.position,
            conversations,
        })
    }
}

/// Opens the store `[store]` configures; None for `backend = "memory"`
/// (nothing is kept). Blocks: call it off the async runtime.
///
/// `leader_epoch`: with PostgreSQL, the epoch of the lease this server leads
/// by; its commits are fenced by it and no advisory lock is taken. `None`
/// opens PostgreSQL exclusively (the advisory lock).
pub fn open(
    config: &StoreConfig,
    leader_epoch: Option<u64>,
) -> Result<Option<Box<dyn Store>>, StoreError> {
    let (url, options, pool) = (
        &config.url,
        postgres::ConnectOptions::of(config),
        config.pool_size,
    );
    Ok(match (config.backend, leader_epoch) {
        (StoreBackend::Memory, _) => None,
        (StoreBackend::Embedded, _) => Some(Box::new(embedded::EmbeddedStore::open(&config.path)?)),
        (StoreBackend::Postgres, None) => Some(Box::new(postgres::PostgresStore::open(
            url, &options, pool,
        )?)),
        (StoreBackend::Postgres, Some(epoch)) => Some(Box::new(
            postgres::PostgresStore::open_leader(url, &options, pool, epoch)?,
        )),
    })
}

/// A storage engine. Calls block; the store's writer thread makes them.
pub trait Store: Send {
    /// Writes the batch atomically and durably: when this returns `Ok`,
    /// everything in it survives a crash of the process or the machine.
    /// An `Err` leaves the outcome unknown; the caller must not retry.
    fn commit(&mut self, batch: &Batch) -> Result<(), StoreError>;

    /// Reads everything (recovery).
    fn load(&mut self) -> Result<Contents, StoreError>;

    /// Where the store is, for log lines and errors.
    fn describe(&self) -> String;
}

impl Batch {
    /// The process groups this batch records, by agent (for tests of what
    /// is durable when).
    #[cfg(test)]
    pub(crate) fn process_groups(&self) -> Vec<(AgentId, crate::scheduler::durable::ProcessGroup)> {
        self.agents
            .iter()
            .filter_map(|(id, row)| {
                let state = rows::decode_agent(row.as_deref()?).ok()?;
                Some((*id, state.process_group?))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::durable::ChangeSet;

    #[test]
    fn a_batch_writes_each_agent_once_as_of_its_latest_change() {
        let a = rows::tests::full_state(1);
        let b = rows::tests::full_state(2);
        let mut later_a = a.clone();
        later_a.view.result = "later".into();
        let mut batch = Batch::default();
        batch.add(&ChangeSet {
            agents: vec![a.clone(), b.clone()],
            ..Default::default()
        });
        let position = LogPosition {
            last_sequence: 9,
            evicted_through: 2,
            next_admission: 3,
        };
        batch.add(&ChangeSet {
            agents: vec![later_a.clone()],
            removed: vec![b.view.id],
            position,
            ..Default::default()
        });
        assert_eq!(batch.change_sets, 2);
        assert_eq!(batch.position, position);
        let ids: Vec<_> = batch
            .agents
            .iter()
            .map(|(id, row)| (*id, row.is_some()))
            .collect();
        assert_eq!(ids, vec![(a.view.id, true), (b.view.id, false)]);
        let contents = Contents {
            agents: vec![batch.agents[0].1.clone().unwrap()],
            ..Default::default()
        };
        assert_eq!(contents.decode().unwrap().agents, vec![later_a]);
    }
}
