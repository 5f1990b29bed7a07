//! Steer: a message delivered to a running run or buffered until it runs.

use std::{sync::Arc, time::SystemTime};

use super::{Core, SteerDelivery};
use crate::config::RunnerKind;
use crate::scheduler::{
    conversation::EntryKind, error::Error, events::EventKind, trace::SpanEventKind, types::*,
    workers::WorkerCommand,
};

impl Core {
    /// Delivers a steer message now (RUNNING) or buffers it (QUEUED,
    /// AWAITING_APPROVAL).
    pub fn steer(
        &mut self,
        scope: &Scope,
        id: AgentId,
        message: String,
    ) -> Result<(AgentView, SteerDelivery), Error> {
        let rec = self
            .agents
            .get_mut(&id)
            .filter(|r| scope.admits(&r.view.tenant))
            .ok_or(Error::NotFound {
                field: "id",
                id: id.to_string(),
            })?;
        let agent_type = self.agent_types.get(&*rec.view.agent);
        if !rec.view.status.is_terminal() && agent_type.is_some_and(|t| !t.accepts_steer()) {
            return Err(Error::SteerNotAccepted {
                id,
                agent_type: rec.view.agent.to_string(),
            });
        }
        // A program reading steer messages as lines would see this one as
        // several: refuse it rather than change it.
        let line_based = agent_type.is_some_and(|t| t.runner == RunnerKind::Command);
        if line_based && message.contains(['\n', '\r']) {
            return Err(Error::invalid(
                "message",
                format!(
                    "agent type \"{}\" reads steer messages as lines on standard input: \
                     the message must be a single line",
                    rec.view.agent
                ),
            ));
        }
        let delivered_bytes = message.len();
        let text: Arc<str> = message.as_str().into();
        // A worker run restored for its worker to re-attach: the session
        // it names is gone, so the message waits (stored) and goes to the
        // worker with the re-attach.
        let reattaching = rec.runner == RunnerKind::Worker
            && rec
                .view
                .worker_id
                .is_none_or(|w| !self.workers.is_connected(w));
        let delivery = match rec.view.status {
            AgentStatus::Running if reattaching => {
                rec.buffer_steer(message);
                self.changed(id);
                SteerDelivery::Buffered
            }
            AgentStatus::Running => {
                match (rec.view.worker_id, &rec.run) {
                    (Some(worker), _) if rec.runner == RunnerKind::Worker => {
                        self.workers.send(
                            worker,
                            WorkerCommand::Steer {
                                agent_id: id,
                                message,
                            },
                        );
                    }
                    (_, Some(run)) => {
                        // A closed inbox means the run is ending; the message
                        // would be lost either way.
                        let _ = run.steer.send(message);
                    }
                    (_, None) => {}
                }
                if let Some(span) = rec.span.as_mut() {
                    let bytes = delivered_bytes;
                    span.push(SystemTime::now(), SpanEventKind::SteerDelivered { bytes });
                }
                SteerDelivery::Delivered
            }
            AgentStatus::Queued | AgentStatus::AwaitingApproval => {
                rec.buffer_steer(message);
                self.changed(id);
                SteerDelivery::Buffered
            }
            status => {
                return Err(Error::AgentFinished {
                    field: "id",
                    id: id.to_string(),
                    status,
                })
            }
        };
        self.conversations
            .record(id, EntryKind::Steer, text, SystemTime::now());
        if delivery == SteerDelivery::Delivered {
            self.publish(id, EventKind::Steered);
        }
        Ok((self.view(id).expect("known agent"), delivery))
    }
}
