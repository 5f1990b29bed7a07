//! A run's steer inbox: the messages Steer calls deliver to a running agent,
//! in arrival order.
//!
//! Every run gets one, and most runs are never steered, so creating one must
//! be cheap: a tokio `mpsc` channel allocates its first 32-slot block up
//! front (about 1 KiB per live run, and ~2 % of server CPU per background
//! Spawn in a profile), where this is one small allocation. One consumer
//! (the runner), one producer (the core, under its lock).

use std::{collections::VecDeque, sync::Arc};

use parking_lot::Mutex;
use tokio::sync::Notify;

/// The core's end: delivers messages, and closes the inbox when dropped.
#[derive(Debug)]
pub struct SteerSender {
    shared: Arc<Shared>,
}

/// The runner's end.
#[derive(Debug)]
pub struct SteerInbox {
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    /// `notify_one` stores a permit when nobody waits, so a message sent
    /// between the receiver's check and its wait still wakes it.
    ready: Notify,
}

#[derive(Debug, Default)]
struct State {
    queue: VecDeque<String>,
    sender_gone: bool,
    receiver_gone: bool,
}

/// A new, empty inbox.
pub fn steer_inbox() -> (SteerSender, SteerInbox) {
    let shared = Arc::new(Shared::default());
    (
        SteerSender {
            shared: shared.clone(),
        },
        SteerInbox { shared },
    )
}

impl SteerSender {
    /// Queues `message` for the runner; gives it back if the runner's end
    /// is gone (the run is ending).
    pub fn send(&self, message: String) -> Result<(), String> {
        {
            let mut state = self.shared.state.lock();
            if state.receiver_gone {
                return Err(message);
            }
            state.queue.push_back(message);
        }
        self.shared.ready.notify_one();
        Ok(())
    }
}

impl Drop for SteerSender {
    fn drop(&mut self) {
        self.shared.state.lock().sender_gone = true;
        self.shared.ready.notify_one();
    }
}

impl SteerInbox {
    /// The next message; None once the inbox is empty and closed (the run
    /// is ending). Cancel-safe: a message is only taken when returned.
    pub async fn recv(&mut self) -> Option<String> {
        loop {
            {
                let mut state = self.shared.state.lock();
                if let Some(message) = state.queue.pop_front() {
                    return Some(message);
                }
                if state.sender_gone {
                    return None;
                }
            }
            self.shared.ready.notified().await;
        }
    }

    /// The next message if one is waiting.
    pub fn try_recv(&mut self) -> Option<String> {
        self.shared.state.lock().queue.pop_front()
    }
}

impl Drop for SteerInbox {
    fn drop(&mut self) {
        self.shared.state.lock().receiver_gone = true;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn delivers_in_order_then_ends_when_the_sender_goes() {
        let (tx, mut rx) = steer_inbox();
        tx.send("a".into()).unwrap();
        tx.send("b".into()).unwrap();
        assert_eq!(rx.try_recv().as_deref(), Some("a"));
        assert_eq!(rx.recv().await.as_deref(), Some("b"));
        assert_eq!(rx.try_recv(), None);
        tx.send("c".into()).unwrap();
        drop(tx);
        // Messages sent before the close are still delivered.
        assert_eq!(rx.recv().await.as_deref(), Some("c"));
        assert_eq!(rx.recv().await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiting_receiver_wakes_on_send_and_on_close() {
        let (tx, mut rx) = steer_inbox();
        let waiter = tokio::spawn(async move {
            let first = rx.recv().await;
            let second = rx.recv().await;
            (first, second)
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        tx.send("hello".into()).unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
        drop(tx);
        assert_eq!(
            waiter.await.unwrap(),
            (Some("hello".to_owned()), None),
            "the receiver woke for the message and for the close"
        );
    }

    #[tokio::test]
    async fn recv_dropped_mid_wait_loses_nothing() {
        let (tx, mut rx) = steer_inbox();
        // Cancel a waiting recv (as a select! whose other branch won does).
        tokio::select! {
            biased;
            () = std::future::ready(()) => {}
            _ = rx.recv() => unreachable!("nothing was sent"),
        }
        tx.send("kept".into()).unwrap();
        assert_eq!(rx.recv().await.as_deref(), Some("kept"));
    }

    #[test]
    fn send_after_the_runner_left_gives_the_message_back() {
        let (tx, rx) = steer_inbox();
        drop(rx);
        assert_eq!(tx.send("late".into()), Err("late".to_owned()));
    }
}
