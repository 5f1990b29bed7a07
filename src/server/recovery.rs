//! Recovery: open the store, rebuild the scheduler from it, start the
//! writer, stop programs that outlived the server, decide interrupted runs.

use anyhow::Context;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::{
    config::Config,
    scheduler::Scheduler,
    store::{self, writer::Writer, StoreError},
};

/// Opens the configured store, rebuilds the scheduler from it, starts the
/// writer and decides the interrupted runs. None with `backend = "memory"`.
///
/// `leader_epoch`: the lease a PostgreSQL server leads by (its commits are
/// fenced by it).
pub(super) async fn recover(
    config: &Config,
    scheduler: &Scheduler,
    store_failed: CancellationToken,
    leader_epoch: Option<u64>,
) -> anyhow::Result<Option<Writer>> {
    let store_config = config.store.clone();
    let started = std::time::Instant::now();
    let opened = tokio::task::spawn_blocking(move || -> Result<_, StoreError> {
        let Some(mut store) = store::open(&store_config, leader_epoch)? else {
            return Ok(None);
        };
        let contents = store.load()?;
        Ok(Some((store, contents.decode()?)))
    })
    .await
    .context("opening the store")??;
    let Some((store, recovered)) = opened else {
        warn!("[store] backend = \"memory\": nothing is kept; a restart loses every agent");
        return Ok(None);
    };
    let described = store.describe();
    let mut report = scheduler
        .restore(recovered, &config.watch)
        .with_context(|| format!("recovering from the {described}"))?;
    let writer = Writer::start(store, scheduler.change_source(), move |e| {
        error!(error = %e, "the store failed; stopping");
        store_failed.cancel();
    })
    .context("starting the store writer")?;
    scheduler.attach_durability(writer.durability());
    // Programs of command runs may have outlived a SIGKILL of the server:
    // stop them before their runs are decided, so no two copies overlap.
    let mut stopped_programs = 0;
    for (id, agent_type, group) in std::mem::take(&mut report.process_groups) {
        let grace = config
            .agents
            .get(&*agent_type)
            .map_or(crate::config::DEFAULT_KILL_GRACE, |t| t.kill_grace());
        if crate::runner::command::stop_orphaned_group(group, grace).await {
            info!(agent_id = %id, pgid = group.pgid, "stopped a command run's program that outlived the server");
            stopped_programs += 1;
        }
    }
    scheduler.recover_runs(&mut report, config.runs.worker_reattach_grace);
    let saved_workspaces = sweep_workspaces(config, scheduler).await;
    info!(
        store = %described,
        agents = report.agents,
        queued = report.queued,
        failed = report.failed,
        retried = report.retried,
        held_for_workers = report.held_for_workers.len(),
        stopped_programs,
        saved_workspaces,
        events = report.events,
        took_ms = started.elapsed().as_millis() as u64,
        "store opened and state recovered"
    );
    Ok(Some(writer))
}

/// Worktrees a crash left behind (the server killed with their runs): each
/// one whose agent will not run again — ended by the recovery, or no longer
/// retained — is committed to its branch and removed, and the agent gets its
/// `workspace` (a WORKSPACE_SAVED event). A run queued again after the
/// restart takes its own worktree back when it starts. Returns how many
/// were saved.
async fn sweep_workspaces(config: &Config, scheduler: &Scheduler) -> usize {
    use crate::runner::{
        command::sweep_worktrees,
        workspace::{Spec, Workspaces},
    };
    use crate::scheduler::run::CoreReports;

    let workspaces = Workspaces::new();
    let default_root = config.store.path.join("worktrees");
    let mut seen = std::collections::HashSet::new();
    let mut saved_count = 0;
    for (name, agent_type) in &config.agents {
        let Some(spec) = Spec::of(agent_type, Some(&default_root)) else {
            continue;
        };
        // Types sharing a repository and root share their worktrees.
        if !seen.insert((spec.repo.clone(), spec.root.clone())) {
            continue;
        }
        let settled = |id: &str| {
            // A folder not named after an agent is not a run's.
            let agent_id = id.parse::<uuid::Uuid>().ok()?;
            match scheduler.inspect(|c| c.view(agent_id)) {
                Some(view) if !view.status.is_terminal() => None,
                Some(view) => Some(view.description.to_string()),
                None => Some(String::new()),
            }
        };
        let saved =
            match sweep_worktrees(&workspaces, &spec, agent_type.kill_grace(), settled).await {
                Ok(saved) => saved,
                Err(e) => {
                    warn!(agent = %name, error = %e, "listing the worktrees a crash left failed");
                    continue;
                }
            };
        saved_count += saved.len();
        for swept in saved {
            if let Ok(agent_id) = swept.id.parse::<uuid::Uuid>() {
                scheduler.set_workspace(agent_id, swept.saved.into()).await;
            }
        }
    }
    saved_count
}
