//! The recovery gate: until the server has read its store and decided the
//! interrupted runs, every AgentService and WorkerService call is answered
//! `UNAVAILABLE` with reason `RECOVERING` (health and reflection answer as
//! usual; health says NOT_SERVING meanwhile).

use std::sync::{
    atomic::{AtomicBool, Ordering},
    Arc,
};

use tonic::{service::Interceptor, Request, Status};

use crate::scheduler::Error;

/// Shared by the services it guards; opened once, when recovery is done.
#[derive(Debug, Clone, Default)]
pub struct RecoveryGate {
    open: Arc<AtomicBool>,
}

impl RecoveryGate {
    /// A gate that refuses calls until [`RecoveryGate::open`].
    pub fn closed() -> Self {
        Self::default()
    }

    /// Lets calls through from now on.
    pub fn open(&self) {
        self.open.store(true, Ordering::Release);
    }
}

impl Interceptor for RecoveryGate {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        if self.open.load(Ordering::Acquire) {
            Ok(request)
        } else {
            Err(Error::Recovering.into())
        }
    }
}
