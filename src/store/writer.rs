//! Group commit: one thread owns the store and writes whatever changed
//! since its last commit as one batch — one transaction, one fsync.
//!
//! Callers never wait for a lock held across I/O. A change is applied in
//! memory under the core's lock and numbered there (its *ticket*); the
//! caller pokes the writer and awaits [`Durability::wait`] for its ticket.
//! The writer takes everything pending in one short lock section, encodes
//! and commits it outside any lock, then raises the durable watermark to
//! the newest ticket it took. While it commits, new changes pile up and
//! become the next batch, so batches grow with load on their own, and an
//! idle server commits at once (no timer).

use std::{
    sync::Arc,
    thread::{self, JoinHandle},
    time::Instant,
};

use tokio::sync::watch;

use super::{Batch, Store, StoreError};
pub use crate::scheduler::durability::{ChangeSource, Durability, StoreFailed};
use crate::scheduler::durability::{Watermark, WriterWake};

/// Commit counts, for the group-commit figures in metrics and benchmarks.
#[derive(Debug, Default)]
pub struct CommitStats {
    /// Completed commits.
    pub commits: std::sync::atomic::AtomicU64,
    /// Changes those commits wrote, counted by ticket (one per changed
    /// record, published event or removal; the core merges every lock
    /// section's changes into one change set per take, so counting change
    /// sets would say 1 per commit). Changes ÷ commits is the group-commit
    /// batch size.
    pub changes: std::sync::atomic::AtomicU64,
}

/// The running writer.
#[derive(Debug)]
pub struct Writer {
    durability: Durability,
    stats: Arc<CommitStats>,
    handle: Option<JoinHandle<()>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

impl Writer {
    /// Starts the writer thread over `store`. `on_failure` runs once, on the
    /// writer thread, when a commit fails (the server exits: a store that
    /// cannot write must not keep accepting work).
    pub fn start(
        mut store: Box<dyn Store>,
        source: Arc<dyn ChangeSource>,
        on_failure: impl FnOnce(&StoreError) + Send + 'static,
    ) -> std::io::Result<Self> {
        let (tx, rx) = watch::channel(Watermark::default());
        let stats = Arc::new(CommitStats::default());
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = Arc::new(WriterWake::default());
        let handle = thread::Builder::new().name("store-writer".into()).spawn({
            let stats = stats.clone();
            let stop = stop.clone();
            move || {
                let mut on_failure = Some(on_failure);
                // The ticket of the previous take: a commit writes the
                // changes numbered after it.
                let mut taken = 0;
                loop {
                    let stopping = stop.load(std::sync::atomic::Ordering::Acquire);
                    let (changes, ticket) = source.take_changes();
                    let in_commit = ticket.saturating_sub(std::mem::replace(&mut taken, ticket));
                    let sequence = changes.position.last_sequence;
                    if changes.is_empty() && sequence <= tx.borrow().sequence {
                        if ticket > tx.borrow().durable {
                            tx.send_modify(|w| w.durable = ticket);
                        }
                        if stopping {
                            return;
                        }
                        // A poke between the take and the park leaves the
                        // token set, so the park returns at once.
                        thread::park();
                        continue;
                    }
                    let mut batch = Batch::default();
                    batch.add(&changes);
                    drop(changes);
                    let started = Instant::now();
                    match store.commit(&batch) {
                        Ok(()) => {
                            stats
                                .commits
                                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            stats
                                .changes
                                .fetch_add(in_commit, std::sync::atomic::Ordering::Relaxed);
                            tracing::trace!(
                                agents = batch.agents.len(),
                                events = batch.events.len(),
                                took_us = started.elapsed().as_micros() as u64,
                                "store commit"
                            );
                            tx.send_modify(|w| {
                                w.durable = ticket;
                                w.sequence = sequence;
                            });
                        }
                        Err(e) => {
                            // Never retried: after a failed fsync the
                            // kernel may have dropped the dirty pages, so
                            // a retry could report durable what is not.
                            tracing::error!(
                                error = %e,
                                store = %store.describe(),
                                "store commit failed; the server stops"
                            );
                            tx.send_modify(|w| w.failed = true);
                            if let Some(f) = on_failure.take() {
                                f(&e);
                            }
                            return;
                        }
                    }
                }
            }
        })?;
        writer.set_thread(handle.thread().clone());
        Ok(Self {
            durability: Durability::new(rx, writer),
            stats,
            handle: Some(handle),
            stop,
        })
    }

    /// A handle to wait on durability.
    pub fn durability(&self) -> Durability {
        self.durability.clone()
    }

    /// Commit counts.
    pub fn stats(&self) -> Arc<CommitStats> {
        self.stats.clone()
    }

    /// Writes what is pending, then stops the thread.
    pub fn stop(mut self) {
        self.finish();
    }

    fn finish(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Release);
        self.durability.poke();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.finish();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use parking_lot::Mutex;

    use super::*;
    use crate::scheduler::durable::ChangeSet;
    use crate::store::{
        memory::{FailingStore, MemoryStore},
        rows::tests::full_state,
    };

    /// A source whose changes a test adds by hand, numbered like the core
    /// numbers its lock sections.
    #[derive(Default)]
    struct Pending {
        inner: Mutex<(ChangeSet, u64)>,
        takes: AtomicUsize,
    }

    impl Pending {
        fn change(&self) -> u64 {
            let mut p = self.inner.lock();
            p.1 += 1;
            let ticket = p.1;
            p.0.agents.push(full_state(ticket));
            ticket
        }
    }

    impl ChangeSource for Pending {
        fn take_changes(&self) -> (ChangeSet, u64) {
            self.takes.fetch_add(1, Ordering::Relaxed);
            let mut p = self.inner.lock();
            let ticket = p.1;
            (std::mem::take(&mut p.0), ticket)
        }
    }

    #[tokio::test]
    async fn a_change_is_durable_once_its_wait_returns() {
        let store = MemoryStore::new();
        let source = Arc::new(Pending::default());
        let writer = Writer::start(Box::new(store.clone()), source.clone(), |_| {}).unwrap();
        let d = writer.durability();
        let tickets: Vec<u64> = (0..50).map(|_| source.change()).collect();
        for t in &tickets {
            d.wait(*t).await.unwrap();
        }
        let stored = store.clone().load_decoded();
        assert_eq!(stored.agents.len(), 50);
        let stats = writer.stats();
        let commits = stats.commits.load(Ordering::Relaxed);
        assert!((1..=50).contains(&commits), "{commits} commits");
        assert_eq!(stats.changes.load(Ordering::Relaxed), 50);
        assert_eq!(d.durable(), 50);
    }

    #[tokio::test]
    async fn a_failed_commit_fails_its_waiters_and_every_later_one() {
        let inner = MemoryStore::new();
        let source = Arc::new(Pending::default());
        let (failed_tx, failed_rx) = std::sync::mpsc::channel();
        let writer = Writer::start(
            Box::new(FailingStore::new(inner.clone(), 1)),
            source.clone(),
            move |e| failed_tx.send(e.to_string()).unwrap(),
        )
        .unwrap();
        let d = writer.durability();
        let first = source.change();
        d.wait(first).await.unwrap();
        let second = source.change();
        assert_eq!(d.wait(second).await, Err(StoreFailed));
        let third = source.change();
        assert_eq!(d.wait(third).await, Err(StoreFailed));
        assert!(failed_rx.recv().unwrap().contains("injected failure"));
        assert_eq!(d.durable(), first);
        assert_eq!(inner.clone().load_decoded().agents.len(), 1);
    }

    #[tokio::test]
    async fn stopping_writes_what_is_pending() {
        let store = MemoryStore::new();
        let source = Arc::new(Pending::default());
        let writer = Writer::start(Box::new(store.clone()), source.clone(), |_| {}).unwrap();
        source.change();
        source.change();
        writer.stop();
        assert_eq!(store.clone().load_decoded().agents.len(), 2);
    }

    impl MemoryStore {
        fn load_decoded(mut self) -> crate::scheduler::durable::Recovered {
            self.load().unwrap().decode().unwrap()
        }
    }
}
