//! Workers: processes that execute runs of `runner = "worker"` agent types
//! over a WorkerService stream.
//!
//! The core owns what admission needs — which workers serve which types,
//! their capacity and the runs each holds — so worker capacity is checked in
//! the same step as the bucket, parent and global limits. The API layer owns
//! the streams: it registers each worker's [`WorkerCommand`] channel here
//! and hands the worker's reports to the core, which applies them to the
//! run's agent. Every command to a worker is sent by the core under its
//! lock, so a worker sees `assign`, `steer`, `approval` and `cancel` for a
//! run in the order the agent went through them.
//!
//! A run holds one unit of its worker's capacity from assignment until the
//! worker reports the run ended (done or failed, also after a cancel), the
//! cancel grace passes, or the worker is lost — whichever comes first, and
//! exactly once ([`WorkerPool::release`] is the only way out of `held`).

use std::{collections::BTreeMap, sync::Arc, time::SystemTime};

use foldhash::{HashMap, HashSet};
use tokio::sync::mpsc;
use uuid::Uuid;

use super::{
    queue::WorkerKey,
    types::{AgentError, AgentId, AgentView, ApprovalOutcome, Usage},
};

/// Server-assigned id of one worker session.
pub type WorkerId = Uuid;

/// What a worker says about itself when it connects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerInfo {
    /// The tenant of its credential: it serves only this tenant's runs.
    pub tenant: Arc<str>,
    /// Human-readable name; need not be unique.
    pub name: Arc<str>,
    /// Agent types it runs.
    pub agents: Vec<Arc<str>>,
    /// Runs it can hold at once (≥ 1).
    pub capacity: u32,
    /// Free-form labels.
    pub labels: BTreeMap<String, String>,
}

impl WorkerInfo {
    /// The capacity keys it serves: its tenant with each of its types.
    fn keys(&self) -> Vec<WorkerKey> {
        self.agents
            .iter()
            .map(|t| (self.tenant.clone(), t.clone()))
            .collect()
    }
}

/// A run a reconnecting worker says it still holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeldRun {
    /// The run's agent.
    pub agent_id: AgentId,
    /// The attempt its assignment carried.
    pub attempt: u32,
}

/// What the server tells a worker.
#[derive(Debug, Clone, PartialEq)]
pub enum WorkerCommand {
    /// Execute a run.
    Assign(Box<Assignment>),
    /// A steer message for a run it holds.
    Steer {
        /// The run's agent.
        agent_id: AgentId,
        /// The message.
        message: String,
    },
    /// Stop a run.
    Cancel {
        /// The run's agent.
        agent_id: AgentId,
        /// Why.
        reason: String,
    },
    /// The decision on a run's approval request.
    Approval {
        /// The run's agent.
        agent_id: AgentId,
        /// The approval decided.
        approval_id: Uuid,
        /// The decision.
        outcome: ApprovalOutcome,
    },
    /// The run's terminal report is durable: the worker may forget it.
    Released {
        /// The run's agent.
        agent_id: AgentId,
        /// The attempt that ended.
        attempt: u32,
    },
    /// An unnumbered workspace report of the agent's attempt was taken
    /// (durably) or refused: the worker stops sending it again.
    WorkspaceAnswered {
        /// The report's agent.
        agent_id: AgentId,
        /// The report's attempt.
        attempt: u32,
    },
}

/// Where a worker's report stands among its run's reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReportNumber {
    /// 1, 2, 3, … per run; 0: not numbered (always applied).
    pub seq: u64,
    /// The run's attempt; 0: not named (the live one).
    pub attempt: u32,
}

/// A run handed to a worker.
#[derive(Debug, Clone, PartialEq)]
pub struct Assignment {
    /// The agent as it is at start.
    pub agent: AgentView,
    /// The prompt.
    pub prompt: Arc<str>,
    /// Steer messages sent while the agent waited, oldest first.
    pub steer_messages: Vec<String>,
    /// When the server ends the run with DEADLINE_EXCEEDED.
    pub deadline: SystemTime,
    /// Trace context of the run, for the worker's spans (its
    /// `traceparent` is formatted when the assignment is encoded).
    pub trace: super::trace::TraceContext,
    /// A continuation's history: the earlier turns of its conversation.
    pub history: Option<Arc<super::conversation::History>>,
    /// Spawn's `workspace_base`: where the run's worktree starts.
    pub workspace_base: Option<Arc<str>>,
    /// The workspace of the agent a continuation or fork continues.
    pub continues_workspace: Option<Arc<super::types::Workspace>>,
}

/// What a worker reports about one of its runs.
#[derive(Debug, Clone, PartialEq)]
pub enum WorkerEvent {
    /// A chunk of output.
    Output(String),
    /// A tool call.
    ToolCall {
        /// Tool name.
        name: String,
        /// Digest of its input; may be empty.
        input_digest: String,
    },
    /// Tokens used.
    Usage(Usage),
    /// The run needs a decision.
    ApprovalRequest {
        /// The tool.
        tool_name: String,
        /// Details for the decider.
        detail: String,
    },
    /// The run starts a turn (`[agents.NAME] max_turns`).
    TurnStarted,
    /// The run's workspace was saved; may come after the run ended.
    Workspace(super::types::Workspace),
    /// Finished with a result (terminal).
    Done {
        /// The result.
        result: String,
        /// The worker's own session of the run, for the run that continues
        /// the agent.
        session: Option<String>,
    },
    /// Failed (terminal).
    Failed {
        /// Why.
        error: AgentError,
        /// As for `Done`.
        session: Option<String>,
        /// A provider's failure another model may not have
        /// (`fallback_models`).
        retryable: bool,
    },
}

impl WorkerEvent {
    /// Done or failed: the worker no longer holds the run.
    pub fn is_terminal(&self) -> bool {
        matches!(self, Self::Done { .. } | Self::Failed { .. })
    }
}

#[derive(Debug)]
struct Worker {
    info: WorkerInfo,
    commands: mpsc::UnboundedSender<WorkerCommand>,
    /// Runs holding its capacity: running, awaiting approval, or stopped
    /// and not yet confirmed ended by the worker.
    held: HashSet<AgentId>,
    /// The worker said it is stopping: it gets no new runs.
    draining: bool,
}

impl Worker {
    /// Room for new runs: none while draining.
    fn free(&self) -> u32 {
        if self.draining {
            return 0;
        }
        self.info.capacity.saturating_sub(self.held.len() as u32)
    }
}

/// Connected workers and the runs they hold.
#[derive(Debug, Default)]
pub struct WorkerPool {
    workers: HashMap<WorkerId, Worker>,
    /// (Tenant, agent type) → workers serving it, in connection order.
    serving: HashMap<WorkerKey, Vec<WorkerId>>,
}

/// How the workers of one agent type are doing, for queue reasons.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TypeCapacity {
    /// Connected workers serving the type.
    pub workers: usize,
    /// Their capacity in total.
    pub capacity: u32,
    /// Runs they hold in total.
    pub held: u32,
}

impl WorkerPool {
    /// Adds a worker; returns its id.
    pub fn register(
        &mut self,
        info: WorkerInfo,
        commands: mpsc::UnboundedSender<WorkerCommand>,
    ) -> WorkerId {
        let id = Uuid::now_v7();
        for key in info.keys() {
            self.serving.entry(key).or_default().push(id);
        }
        self.workers.insert(
            id,
            Worker {
                info,
                commands,
                held: HashSet::default(),
                draining: false,
            },
        );
        id
    }

    /// The worker is stopping: nothing more is assigned to it (its held
    /// runs go on). False if it is not connected.
    pub fn drain(&mut self, id: WorkerId) -> bool {
        self.workers
            .get_mut(&id)
            .map(|w| w.draining = true)
            .is_some()
    }

    /// Removes a worker; returns what it was and the runs it held (their
    /// capacity goes with it).
    pub fn remove(&mut self, id: WorkerId) -> Option<(WorkerInfo, Vec<AgentId>)> {
        let worker = self.workers.remove(&id)?;
        for key in worker.info.keys() {
            if let Some(ids) = self.serving.get_mut(&key) {
                ids.retain(|w| *w != id);
                if ids.is_empty() {
                    self.serving.remove(&key);
                }
            }
        }
        let mut held: Vec<AgentId> = worker.held.into_iter().collect();
        held.sort_unstable();
        Some((worker.info, held))
    }

    /// Whether a worker session is connected.
    pub fn is_connected(&self, id: WorkerId) -> bool {
        self.workers.contains_key(&id)
    }

    /// The (tenant, agent type) keys a worker serves.
    pub fn keys_of(&self, id: WorkerId) -> Vec<WorkerKey> {
        self.workers
            .get(&id)
            .map_or_else(Vec::new, |w| w.info.keys())
    }

    /// Whether a worker serves `agent_type` of `tenant`.
    pub fn serves(&self, id: WorkerId, tenant: &str, agent_type: &str) -> bool {
        self.workers.get(&id).is_some_and(|w| {
            *w.info.tenant == *tenant && w.info.agents.iter().any(|t| **t == *agent_type)
        })
    }

    /// Whether some worker serving `key` has a free slot.
    pub fn has_room(&self, key: &WorkerKey) -> bool {
        self.serving
            .get(key)
            .is_some_and(|ids| ids.iter().any(|id| self.workers[id].free() > 0))
    }

    /// Totals over the workers serving `key`.
    pub fn capacity_of(&self, key: &WorkerKey) -> TypeCapacity {
        let mut total = TypeCapacity::default();
        for id in self.serving.get(key).into_iter().flatten() {
            let w = &self.workers[id];
            total.workers += 1;
            total.capacity += w.info.capacity;
            total.held += w.held.len() as u32;
        }
        total
    }

    /// The worker serving `key` with the most free capacity (the earliest
    /// connected among equals), if any has room.
    pub fn pick(&self, key: &WorkerKey) -> Option<WorkerId> {
        let ids = self.serving.get(key)?;
        let mut best: Option<(u32, WorkerId)> = None;
        for id in ids {
            let free = self.workers[id].free();
            if free > 0 && best.is_none_or(|(f, _)| free > f) {
                best = Some((free, *id));
            }
        }
        best.map(|(_, id)| id)
    }

    /// Takes one unit of `worker`'s capacity for `agent`'s run.
    pub fn hold(&mut self, worker: WorkerId, agent: AgentId) {
        if let Some(w) = self.workers.get_mut(&worker) {
            w.held.insert(agent);
        }
    }

    /// Frees `agent`'s unit of `worker`'s capacity. True only the first
    /// time, so a release is counted once whichever path gets there first.
    pub fn release(&mut self, worker: WorkerId, agent: AgentId) -> bool {
        self.workers
            .get_mut(&worker)
            .is_some_and(|w| w.held.remove(&agent))
    }

    /// Whether `worker` still holds `agent`'s run.
    pub fn holds(&self, worker: WorkerId, agent: AgentId) -> bool {
        self.workers
            .get(&worker)
            .is_some_and(|w| w.held.contains(&agent))
    }

    /// Sends a command to a worker; false if it is gone.
    pub fn send(&self, worker: WorkerId, command: WorkerCommand) -> bool {
        self.workers
            .get(&worker)
            .is_some_and(|w| w.commands.send(command).is_ok())
    }

    /// Every worker's (id, capacity, held runs), for invariant checks.
    pub fn snapshot(&self) -> Vec<(WorkerId, u32, Vec<AgentId>)> {
        let mut out: Vec<_> = self
            .workers
            .iter()
            .map(|(id, w)| {
                let mut held: Vec<AgentId> = w.held.iter().copied().collect();
                held.sort_unstable();
                (*id, w.info.capacity, held)
            })
            .collect();
        out.sort_unstable_by_key(|(id, _, _)| *id);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(name: &str, agents: &[&str], capacity: u32) -> WorkerInfo {
        WorkerInfo {
            tenant: "t".into(),
            name: name.into(),
            agents: agents.iter().map(|a| Arc::from(*a)).collect(),
            capacity,
            labels: BTreeMap::new(),
        }
    }

    fn key(agent_type: &str) -> WorkerKey {
        ("t".into(), agent_type.into())
    }

    fn pool_with(workers: &[(&str, &[&str], u32)]) -> (WorkerPool, Vec<WorkerId>) {
        let mut pool = WorkerPool::default();
        let ids = workers
            .iter()
            .map(|(n, a, c)| pool.register(info(n, a, *c), mpsc::unbounded_channel().0))
            .collect();
        (pool, ids)
    }

    #[test]
    fn picks_the_worker_with_the_most_free_capacity() {
        let (mut pool, ids) = pool_with(&[("a", &["coder"], 2), ("b", &["coder"], 3)]);
        assert_eq!(pool.pick(&key("coder")), Some(ids[1]));
        pool.hold(ids[1], Uuid::from_u128(1));
        pool.hold(ids[1], Uuid::from_u128(2));
        // a: 2 free, b: 1 free.
        assert_eq!(pool.pick(&key("coder")), Some(ids[0]));
        assert_eq!(pool.pick(&key("reviewer")), None);
        assert!(!pool.has_room(&key("reviewer")));
    }

    #[test]
    fn capacity_is_respected_and_released_once() {
        let (mut pool, ids) = pool_with(&[("a", &["coder"], 1)]);
        let run = Uuid::from_u128(7);
        pool.hold(ids[0], run);
        assert!(!pool.has_room(&key("coder")));
        assert_eq!(pool.pick(&key("coder")), None);
        assert!(pool.release(ids[0], run));
        assert!(!pool.release(ids[0], run), "a second release is a no-op");
        assert!(pool.has_room(&key("coder")));
    }

    #[test]
    fn a_draining_worker_gets_nothing_new_but_keeps_its_runs() {
        let (mut pool, ids) = pool_with(&[("a", &["coder"], 2), ("b", &["coder"], 1)]);
        let run = Uuid::from_u128(3);
        pool.hold(ids[0], run);
        assert!(pool.drain(ids[0]));
        assert_eq!(
            pool.pick(&key("coder")),
            Some(ids[1]),
            "a, though freer, drains"
        );
        pool.hold(ids[1], Uuid::from_u128(4));
        assert!(!pool.has_room(&key("coder")));
        assert!(pool.holds(ids[0], run));
        assert!(pool.release(ids[0], run));
        assert_eq!(
            pool.pick(&key("coder")),
            None,
            "released capacity stays closed"
        );
        assert!(!pool.drain(Uuid::from_u128(99)));
    }

    #[test]
    fn removing_a_worker_returns_its_runs_and_its_types() {
        let (mut pool, ids) = pool_with(&[("a", &["coder", "tester"], 2), ("b", &["coder"], 1)]);
        pool.hold(ids[0], Uuid::from_u128(2));
        pool.hold(ids[0], Uuid::from_u128(1));
        let (info, held) = pool.remove(ids[0]).expect("known");
        assert_eq!(&*info.name, "a");
        assert_eq!(held, vec![Uuid::from_u128(1), Uuid::from_u128(2)]);
        assert!(!pool.has_room(&key("tester")));
        assert!(pool.has_room(&key("coder")));
        assert_eq!(pool.capacity_of(&key("coder")).workers, 1);
        assert!(pool.remove(ids[0]).is_none());
    }

    #[test]
    fn a_worker_serves_only_its_own_tenant() {
        let (mut pool, ids) = pool_with(&[("a", &["coder"], 2)]);
        let other = pool.register(
            WorkerInfo {
                tenant: "u".into(),
                ..info("b", &["coder"], 5)
            },
            mpsc::unbounded_channel().0,
        );
        assert_eq!(
            pool.pick(&key("coder")),
            Some(ids[0]),
            "b has more room but is u's"
        );
        assert_eq!(pool.pick(&("u".into(), "coder".into())), Some(other));
        assert_eq!(pool.capacity_of(&key("coder")).capacity, 2);
        assert!(pool.serves(ids[0], "t", "coder"));
        assert!(!pool.serves(ids[0], "u", "coder"));
        pool.hold(ids[0], Uuid::from_u128(1));
        pool.hold(ids[0], Uuid::from_u128(2));
        assert!(
            !pool.has_room(&key("coder")),
            "u's worker never makes room for t"
        );
    }
}
