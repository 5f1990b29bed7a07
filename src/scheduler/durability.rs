//! The durability seam: the scheduler hands its changes to a writer
//! ([`ChangeSource`], implemented by the handle) and waits on the durable
//! watermark the writer raises ([`Durability`]). The writer itself, group
//! commit on its own thread, is the store's (`crate::store::writer`).

use std::sync::Arc;

use tokio::sync::watch;

use super::durable::ChangeSet;

/// Where the writer takes pending changes from: the scheduler core, under
/// its lock.
pub trait ChangeSource: Send + Sync + 'static {
    /// Everything changed since the previous call, and the ticket of the
    /// newest change in it.
    fn take_changes(&self) -> (ChangeSet, u64);
}

/// The durable watermark, as waiters see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Watermark {
    /// Every change with a ticket up to this one is durable.
    pub durable: u64,
    /// Every event up to this sequence number is durable.
    pub sequence: u64,
    /// A commit failed: nothing after `durable` ever will be.
    pub failed: bool,
}

/// A change could not be made durable: the store failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the store failed: the change may not have been written")]
pub struct StoreFailed;

/// What a waiter holds to learn when its change is durable.
#[derive(Debug, Clone)]
pub struct Durability {
    rx: watch::Receiver<Watermark>,
    writer: Arc<WriterWake>,
}

impl Durability {
    /// What the writer that sends `rx` and wakes on `writer` hands out.
    pub fn new(rx: watch::Receiver<Watermark>, writer: Arc<WriterWake>) -> Self {
        Self { rx, writer }
    }

    /// Returns once the change numbered `ticket` is durable, or fails once
    /// the store has failed before writing it.
    pub async fn wait(&self, ticket: u64) -> Result<(), StoreFailed> {
        self.wait_until(|w| w.durable >= ticket).await
    }

    /// Returns once every event up to `sequence` is durable, or fails once
    /// the store has failed before writing it.
    pub async fn wait_sequence(&self, sequence: u64) -> Result<(), StoreFailed> {
        self.wait_until(|w| w.sequence >= sequence).await
    }

    async fn wait_until(&self, reached: impl Fn(&Watermark) -> bool) -> Result<(), StoreFailed> {
        let now = *self.rx.borrow();
        if reached(&now) {
            return Ok(());
        }
        if now.failed {
            return Err(StoreFailed);
        }
        self.writer.poke();
        let mut rx = self.rx.clone();
        // The writer gone without failing also ends the wait (`Err`): it
        // only stops with the process, so that is never durable.
        let ok = rx
            .wait_for(|w| reached(w) || w.failed)
            .await
            .is_ok_and(|w| reached(&w));
        if ok {
            Ok(())
        } else {
            Err(StoreFailed)
        }
    }

    /// Asks the writer to commit what is pending (for changes nobody waits
    /// on, e.g. a run's report).
    pub fn poke(&self) {
        self.writer.poke();
    }

    /// [`Durability::poke`] when `ticket` is not durable yet.
    pub fn poke_if_behind(&self, ticket: u64) {
        if self.rx.borrow().durable < ticket {
            self.writer.poke();
        }
    }

    /// The newest durable ticket.
    pub fn durable(&self) -> u64 {
        self.rx.borrow().durable
    }
}

/// Wakes the writer's thread (parked while nothing is pending).
#[derive(Debug, Default)]
pub struct WriterWake {
    thread: std::sync::OnceLock<std::thread::Thread>,
}

impl WriterWake {
    /// The writer's thread, set once it runs.
    pub fn set_thread(&self, thread: std::thread::Thread) {
        let _ = self.thread.set(thread);
    }

    fn poke(&self) {
        if let Some(t) = self.thread.get() {
            t.unpark();
        }
    }
}
