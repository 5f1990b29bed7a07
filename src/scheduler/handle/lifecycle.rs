//! The server's lifecycle through the handle: restore and recovery at
//! start, reload, retention sweeps, and the steps of a shutdown.

use std::time::{Duration, SystemTime};

use super::Scheduler;
use crate::config::Config;
use crate::scheduler::{
    core::{
        recovery::{Inconsistent, RecoveryReport},
        Core,
    },
    durable,
    events::Received,
    types::WatchQuery,
};

impl Scheduler {
    /// Loads a store's contents into this (new) scheduler; see
    /// [`Core::restore`]. Call [`Scheduler::recover_runs`] once the writer
    /// is attached.
    pub fn restore(
        &self,
        recovered: durable::Recovered,
        watch: &crate::config::WatchConfig,
    ) -> Result<RecoveryReport, Inconsistent> {
        self.shared
            .core
            .lock()
            .restore(recovered, watch.history, watch.subscriber_buffer)
    }
    /// Decides interrupted in-process runs and starts what may start (see
    /// [`Core::recover_runs`]); worker runs nobody re-attaches within
    /// `grace` then follow the worker-lost rules.
    pub fn recover_runs(&self, report: &mut RecoveryReport, grace: Duration) {
        self.with_core(|c| c.recover_runs(report));
        if report.held_for_workers.is_empty() {
            return;
        }
        let (this, held) = (self.clone(), report.held_for_workers.clone());
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            let ended = this.with_core(|c| c.reattach_grace_passed(&held));
            if ended > 0 {
                tracing::info!(ended, "worker runs not re-attached within the grace");
            }
        });
    }
    /// Stops admitting and starting agents; running ones go on (see
    /// [`Core::stop_admitting`]).
    pub fn stop_admitting(&self) {
        self.with_core(Core::stop_admitting);
    }
    /// Waits until `count` (e.g. [`Core::running_count`]) is 0, or `grace`
    /// passed. Returns whether it reached 0. Woken by lifecycle events, not
    /// a clock.
    pub async fn wait_for_runs(&self, grace: Duration, count: fn(&Core) -> u32) -> bool {
        let mut events = self.subscribe(&WatchQuery::default()).live;
        let deadline = tokio::time::Instant::now().checked_add(grace);
        loop {
            if self.inspect(count) == 0 {
                return true;
            }
            let next = events.recv();
            let received = match deadline {
                Some(deadline) => match tokio::time::timeout_at(deadline, next).await {
                    Ok(received) => received,
                    Err(_) => return false,
                },
                None => next.await,
            };
            // Lagged: some events were missed; the count above is what
            // matters, so look again.
            if let Received::Closed = received {
                return self.inspect(count) == 0;
            }
        }
    }
    /// Applies a reloaded config (limits, runs, agent types).
    pub fn reconfigure(&self, config: &Config) {
        self.with_core(|c| {
            c.set_tenant_limits(config.tenants.clone());
            c.set_conversations(config.conversations);
            c.reconfigure(
                config.limits.clone(),
                config.runs.clone(),
                config.agents.clone(),
            )
        });
    }
    /// Forgets finished agents past retention; returns how many.
    pub fn sweep(&self) -> usize {
        self.with_core(|c| c.sweep(SystemTime::now()))
    }
    /// How often [`Scheduler::sweep`] should run for the current retention.
    pub fn sweep_interval(&self) -> Duration {
        let retention = self.inspect(Core::finished_retention);
        (retention / 4).clamp(Duration::from_millis(10), Duration::from_secs(1))
    }
    /// See [`Core::detach_runs`].
    pub fn detach_runs(&self) -> usize {
        self.with_core(Core::detach_runs)
    }
    /// Stops admitting (every Spawn from now on is UNAVAILABLE) and cancels
    /// every live agent with `reason`, in one step under the lock, so no
    /// Spawn slips in between and nothing queued starts. Returns how many
    /// agents were cancelled.
    pub fn shut_down(&self, reason: &str) -> usize {
        self.with_core(|c| c.shut_down(reason))
    }
}
