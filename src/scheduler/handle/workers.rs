//! Connected workers as the handle sees them: registration, drain, loss,
//! and reports (a terminal one released once durable).

use super::Scheduler;
use crate::scheduler::{
    core::Core,
    types::AgentId,
    workers::{HeldRun, ReportNumber, WorkerCommand, WorkerEvent, WorkerId, WorkerInfo},
};

impl Scheduler {
    /// Registers a connected worker (see [`Core::register_worker`]).
    pub fn register_worker(
        &self,
        info: WorkerInfo,
        commands: tokio::sync::mpsc::UnboundedSender<WorkerCommand>,
        held: &[HeldRun],
    ) -> WorkerId {
        self.with_core(|c| c.register_worker(info, commands, held))
    }
    /// Agent types with `runner = "worker"` in the current config.
    pub fn worker_agent_types(&self) -> Vec<String> {
        self.inspect(Core::worker_agent_types)
    }
    /// A worker is draining (see [`Core::drain_worker`]).
    pub fn drain_worker(&self, worker: WorkerId) -> bool {
        self.inspect_mut(|c| c.drain_worker(worker))
    }
    /// A worker's session ended (see [`Core::worker_lost`]).
    pub fn worker_lost(&self, worker: WorkerId) -> usize {
        self.with_core(|c| c.worker_lost(worker))
    }
    /// A worker reported on one of its runs (see [`Core::worker_report`]).
    ///
    /// A terminal report is answered with `released` once it is durable:
    /// until then the worker keeps the run, so a crash of the server that
    /// loses the report finds the run still held and the worker sends it
    /// again after the re-attach.
    pub fn worker_report(
        &self,
        worker: WorkerId,
        agent: AgentId,
        number: ReportNumber,
        event: WorkerEvent,
    ) -> bool {
        let terminal = event.is_terminal();
        let unheld_workspace = number.seq == 0 && matches!(event, WorkerEvent::Workspace(_));
        let (accepted, ticket) =
            self.with_core_ticket(|c| c.worker_report(worker, agent, number, event));
        if unheld_workspace {
            let this = self.clone();
            tokio::spawn(async move {
                if this.durable(ticket).await.is_ok() {
                    this.inspect(|c| c.answer_workspace(worker, agent, number.attempt));
                }
            });
        } else if terminal {
            let this = self.clone();
            tokio::spawn(async move {
                // A failed store stops the server: the worker keeps the run
                // for the next one.
                if this.durable(ticket).await.is_ok() {
                    this.inspect(|c| c.release_worker_run(worker, agent, number.attempt));
                }
            });
        }
        accepted
    }
}
