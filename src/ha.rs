//! Leader election among servers that share one PostgreSQL store.
//!
//! An [`Elector`] runs one task: as a standby it tries to take the lease
//! every `lease_ttl / 3`; as the leader it renews it every `lease_ttl / 3`
//! and, when renewals keep failing, steps down at
//! `valid_until - lease_ttl / 5`, before any other server could take the
//! lease (see [`crate::store::postgres::lease`] for why `valid_until` is safe). It
//! publishes its [`Role`] on a watch channel; what a server does on each
//! change (start scheduling, stop its runs) is the server's business.
//!
//! A leader whose process was frozen (SIGSTOP, a stalled VM) finds on
//! waking that its step-down deadline has passed and steps down before
//! renewing: a renewal after the deadline could race a take-over. Fencing
//! (a commit checks the lease epoch) still stops its writes if it acted
//! anyway.

use std::{future::Future, sync::Arc, time::Duration};

use parking_lot::Mutex;
use tokio::{sync::watch, task::JoinHandle, time::Instant};

use crate::store::{
    postgres::lease::{Lease, LeaseClient, LeaseRecord},
    postgres::ConnectOptions,
    StoreError,
};

/// What this server is in the election.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Not leading: forwards to the leader, if any.
    Standby,
    /// Leading by this lease.
    Leader(Lease),
}

/// The lease calls an elector makes ([`LeaseClient`] in a server; a model
/// in tests).
pub trait LeaseBackend: Send + Sync + 'static {
    /// See [`LeaseClient::try_acquire`].
    fn try_acquire(
        &self,
        holder: &str,
        ttl: Duration,
    ) -> impl Future<Output = Result<Option<Lease>, StoreError>> + Send;
    /// See [`LeaseClient::renew`].
    fn renew(
        &self,
        lease: Lease,
        ttl: Duration,
    ) -> impl Future<Output = Result<Option<Lease>, StoreError>> + Send;
    /// See [`LeaseClient::release`].
    fn release(&self, lease: Lease) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// See [`LeaseClient::current`].
    fn current(&self) -> impl Future<Output = Result<Option<LeaseRecord>, StoreError>> + Send;
    /// Resolves when some server may have released the lease (a hint: it
    /// may also never resolve, and polling still takes a free lease).
    fn released(&self) -> impl Future<Output = ()> + Send;
}

/// The lease in a PostgreSQL database, over one connection that is opened
/// again when it was lost (a database restart, a network cut): servers
/// that cannot reach the database keep trying rather than exit.
#[derive(Debug)]
pub struct PgLease {
    url: String,
    options: ConnectOptions,
    client: Mutex<Option<Arc<LeaseClient>>>,
}

impl PgLease {
    /// A lease on the database at `url` (password and TLS per
    /// `options`); connects at its first call.
    pub fn new(url: &str, options: ConnectOptions) -> Self {
        Self {
            url: url.to_owned(),
            options,
            client: Mutex::new(None),
        }
    }

    async fn client(&self) -> Result<Arc<LeaseClient>, StoreError> {
        let open = self.client.lock().clone().filter(|c| !c.is_closed());
        if let Some(client) = open {
            return Ok(client);
        }
        let client = Arc::new(LeaseClient::connect(&self.url, &self.options).await?);
        *self.client.lock() = Some(client.clone());
        Ok(client)
    }
}

impl LeaseBackend for PgLease {
    async fn try_acquire(&self, holder: &str, ttl: Duration) -> Result<Option<Lease>, StoreError> {
        self.client().await?.try_acquire(holder, ttl).await
    }
    async fn renew(&self, lease: Lease, ttl: Duration) -> Result<Option<Lease>, StoreError> {
        self.client().await?.renew(lease, ttl).await
    }
    async fn release(&self, lease: Lease) -> Result<(), StoreError> {
        self.client().await?.release(lease).await
    }
    async fn current(&self) -> Result<Option<LeaseRecord>, StoreError> {
        self.client().await?.current().await
    }
    async fn released(&self) {
        let client = self.client.lock().clone();
        match client {
            Some(client) => client.released().await,
            None => std::future::pending().await,
        }
    }
}

/// The holder name of a server: its advertised address (where standbys
/// forward to) and an id of this process (so that a restarted server on
/// the same address is a different holder).
pub fn holder_name(advertised: &str) -> String {
    format!("{advertised}#{}", uuid::Uuid::new_v4().simple())
}

/// The advertised address in a holder name.
pub fn address_of(holder: &str) -> &str {
    holder
        .rsplit_once('#')
        .map_or(holder, |(address, _)| address)
}

/// The timers of an election, all derived from `lease_ttl`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// How long a lease lasts unless renewed.
    pub ttl: Duration,
}

impl Timing {
    /// How often a standby tries to take the lease, and how often a leader
    /// renews it.
    pub fn interval(self) -> Duration {
        self.ttl / 3
    }
    /// How long before its lease's local deadline a leader that could not
    /// renew steps down, leaving time to stop its runs.
    pub fn margin(self) -> Duration {
        self.ttl / 5
    }
    /// How long one lease call may take before it counts as failed.
    pub fn call_timeout(self) -> Duration {
        self.ttl / 5
    }
    /// The pause between renewal attempts after one failed.
    pub fn retry(self) -> Duration {
        self.ttl / 10
    }
}

/// A running election.
#[derive(Debug)]
pub struct Elector {
    role: watch::Receiver<Role>,
    leader: watch::Receiver<Option<String>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl Elector {
    /// Starts electing for `holder` (this server's advertised address and
    /// instance id).
    pub fn start<B: LeaseBackend>(backend: Arc<B>, holder: String, timing: Timing) -> Self {
        let (tx, role) = watch::channel(Role::Standby);
        let (leader_tx, leader) = watch::channel(None);
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(run(backend, holder, timing, (tx, leader_tx), stopped));
        Self {
            role,
            leader,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// The current role, and its changes.
    pub fn role(&self) -> watch::Receiver<Role> {
        self.role.clone()
    }

    /// The holder of a live lease, as a standby last saw it (`None`: no
    /// leader known, or this server leads).
    pub fn leader(&self) -> watch::Receiver<Option<String>> {
        self.leader.clone()
    }

    /// Stops electing; a lease held is released at once, so a standby can
    /// take over without waiting for its expiry. Call it after this server
    /// stopped acting as leader.
    pub async fn resign(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for Elector {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

async fn run<B: LeaseBackend>(
    backend: Arc<B>,
    holder: String,
    t: Timing,
    (role, leader): (watch::Sender<Role>, watch::Sender<Option<String>>),
    mut stopped: tokio::sync::oneshot::Receiver<()>,
) {
    let mut lease: Option<Lease> = None;
    let mut next = Instant::now();
    loop {
        tokio::select! {
            biased;
            _ = &mut stopped => break,
            () = tokio::time::sleep_until(next) => {}
            // A standby tries at once when a leader says it let go.
            () = backend.released(), if lease.is_none() => {}
        }
        let now = Instant::now();
        match lease {
            Some(held) if now >= held.valid_until - t.margin() => {
                // Frozen or cut off past the deadline: stop before anything
                // else, never renew this late.
                tracing::warn!(
                    epoch = held.epoch,
                    "leader lease not renewed in time; stepping down"
                );
                lease = None;
                role.send_replace(Role::Standby);
                next = now;
            }
            Some(held) => {
                let renewed =
                    tokio::time::timeout(t.call_timeout(), backend.renew(held, t.ttl)).await;
                match renewed {
                    Ok(Ok(Some(fresh))) => {
                        lease = Some(fresh);
                        role.send_replace(Role::Leader(fresh));
                        next = now + t.interval();
                    }
                    Ok(Ok(None)) => {
                        tracing::warn!(
                            epoch = held.epoch,
                            "leader lease lost to another server; stepping down"
                        );
                        lease = None;
                        role.send_replace(Role::Standby);
                        next = now + t.interval();
                    }
                    Ok(Err(e)) => {
                        tracing::warn!(epoch = held.epoch, error = %e, "leader lease renewal failed; retrying");
                        next = (now + t.retry()).min(held.valid_until - t.margin());
                    }
                    Err(_) => {
                        tracing::warn!(
                            epoch = held.epoch,
                            "leader lease renewal timed out; retrying"
                        );
                        next = (Instant::now() + t.retry()).min(held.valid_until - t.margin());
                    }
                }
            }
            None => {
                match tokio::time::timeout(t.call_timeout(), backend.try_acquire(&holder, t.ttl))
                    .await
                {
                    Ok(Ok(Some(taken))) => {
                        // Each take-over adds one to the epoch (ACQUIRE).
                        tracing::info!(
                            epoch = taken.epoch,
                            previous_epoch = taken.epoch - 1,
                            holder,
                            "elected: this server leads"
                        );
                        lease = Some(taken);
                        leader.send_replace(None);
                        role.send_replace(Role::Leader(taken));
                    }
                    Ok(Ok(None)) => {
                        let seen =
                            match tokio::time::timeout(t.call_timeout(), backend.current()).await {
                                Ok(Ok(Some(record))) if !record.remaining.is_zero() => {
                                    Some(record.holder)
                                }
                                _ => None,
                            };
                        leader.send_if_modified(|known| {
                            if *known == seen {
                                return false;
                            }
                            if let Some(holder) = &seen {
                                tracing::info!(leader = holder, "another server leads");
                            }
                            *known = seen;
                            true
                        });
                    }
                    Ok(Err(e)) => {
                        leader.send_replace(None);
                        tracing::warn!(error = %e, "cannot reach the lease; retrying");
                    }
                    Err(_) => {
                        leader.send_replace(None);
                        tracing::warn!("taking the lease timed out; retrying");
                    }
                }
                next = now + t.interval();
            }
        }
    }
    if let Some(held) = lease {
        role.send_replace(Role::Standby);
        if let Ok(Err(e)) = tokio::time::timeout(t.call_timeout(), backend.release(held)).await {
            tracing::warn!(epoch = held.epoch, error = %e, "could not release the leader lease; it expires");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    /// The lease row as the database keeps it, on tokio's (paused) clock.
    #[derive(Debug, Default)]
    struct Row {
        holder: String,
        epoch: u64,
        expires: Option<Instant>,
    }

    /// A model of the lease table; `down` makes every call fail.
    #[derive(Debug, Default)]
    struct Model {
        row: Mutex<Row>,
        down: AtomicBool,
        /// Every take-over: (epoch, holder, when).
        history: Mutex<Vec<(u64, String, Instant)>>,
        /// Every successful renewal: (epoch, when).
        renewals: Mutex<Vec<(u64, Instant)>>,
        /// Notified on release (as LISTEN/NOTIFY does).
        released: tokio::sync::Notify,
    }

    impl Model {
        fn check(&self) -> Result<(), StoreError> {
            if self.down.load(Ordering::SeqCst) {
                Err(StoreError::Engine("database down".into()))
            } else {
                Ok(())
            }
        }
    }

    impl LeaseBackend for Model {
        async fn try_acquire(
            &self,
            holder: &str,
            ttl: Duration,
        ) -> Result<Option<Lease>, StoreError> {
            self.check()?;
            let now = Instant::now();
            let mut row = self.row.lock();
            if row.expires.is_some_and(|e| e > now) {
                return Ok(None);
            }
            row.epoch += 1;
            row.holder = holder.to_owned();
            row.expires = Some(now + ttl);
            self.history
                .lock()
                .push((row.epoch, holder.to_owned(), now));
            Ok(Some(Lease {
                epoch: row.epoch,
                valid_until: now + ttl,
            }))
        }
        async fn renew(&self, lease: Lease, ttl: Duration) -> Result<Option<Lease>, StoreError> {
            self.check()?;
            let now = Instant::now();
            let mut row = self.row.lock();
            if row.epoch != lease.epoch || row.expires.is_none_or(|e| e <= now) {
                return Ok(None);
            }
            row.expires = Some(now + ttl);
            self.renewals.lock().push((lease.epoch, now));
            Ok(Some(Lease {
                epoch: lease.epoch,
                valid_until: now + ttl,
            }))
        }
        async fn release(&self, lease: Lease) -> Result<(), StoreError> {
            self.check()?;
            let mut row = self.row.lock();
            if row.epoch == lease.epoch {
                row.expires = Some(Instant::now());
                self.released.notify_one();
            }
            Ok(())
        }
        async fn current(&self) -> Result<Option<LeaseRecord>, StoreError> {
            self.check()?;
            let row = self.row.lock();
            Ok(row.expires.map(|e| LeaseRecord {
                holder: row.holder.clone(),
                epoch: row.epoch,
                remaining: e.saturating_duration_since(Instant::now()),
            }))
        }
        async fn released(&self) {
            self.released.notified().await;
        }
    }

    const TIMING: Timing = Timing {
        ttl: Duration::from_secs(10),
    };

    async fn leader_of(electors: &[&Elector]) -> Vec<usize> {
        (0..electors.len())
            .filter(|i| matches!(*electors[*i].role().borrow(), Role::Leader(_)))
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn one_of_two_servers_leads_and_keeps_leading_while_it_renews() {
        let model = Arc::new(Model::default());
        let a = Elector::start(model.clone(), "a".into(), TIMING);
        let b = Elector::start(model.clone(), "b".into(), TIMING);
        let mut role = a.role();
        let mut other = b.role();
        // Whichever took it first, exactly one leads from then on.
        tokio::select! {
            _ = role.wait_for(|r| matches!(r, Role::Leader(_))) => {}
            _ = other.wait_for(|r| matches!(r, Role::Leader(_))) => {}
        }
        for _ in 0..100 {
            tokio::time::sleep(TIMING.ttl / 7).await;
            assert_eq!(leader_of(&[&a, &b]).await.len(), 1);
        }
        // The standby knows who leads; the leader sees no other leader.
        let (leads, follows) = if leader_of(&[&a, &b]).await == [0] {
            (&a, &b)
        } else {
            (&b, &a)
        };
        let leading = model.row.lock().holder.clone();
        assert_eq!(*follows.leader().borrow(), Some(leading));
        assert_eq!(*leads.leader().borrow(), None);
        assert_eq!(model.history.lock().len(), 1, "{:?}", model.history.lock());
    }

    #[tokio::test(start_paused = true)]
    async fn a_leader_cut_off_from_the_database_steps_down_before_its_lease_can_be_taken() {
        let model = Arc::new(Model::default());
        let a = Elector::start(model.clone(), "a".into(), TIMING);
        let mut role = a.role();
        let lease = match *role
            .wait_for(|r| matches!(r, Role::Leader(_)))
            .await
            .unwrap()
        {
            Role::Leader(l) => l,
            Role::Standby => unreachable!(),
        };
        let _ = lease;
        model.down.store(true, Ordering::SeqCst);
        let cut = Instant::now();
        role.wait_for(|r| *r == Role::Standby).await.unwrap();
        let stepped_down = Instant::now();
        // The lease the database holds lasts at least until the last
        // renewal before the cut plus ttl, and the leader is gone first.
        let expires = model.row.lock().expires.unwrap();
        assert!(
            stepped_down < expires,
            "stepped down at {:?}, lease until {:?}",
            stepped_down - cut,
            expires - cut
        );
        assert!(expires - stepped_down >= TIMING.margin() - Duration::from_millis(1));

        // Back up: the lease is taken again (by the only server), with a
        // larger epoch, once it expired.
        model.down.store(false, Ordering::SeqCst);
        role.wait_for(|r| matches!(r, Role::Leader(_)))
            .await
            .unwrap();
        let history = model.history.lock();
        assert_eq!(history.len(), 2);
        assert!(history[1].0 > history[0].0 && history[1].2 >= expires);
    }

    #[tokio::test(start_paused = true)]
    async fn a_resigning_leader_releases_the_lease_and_a_standby_takes_it_at_once() {
        let model = Arc::new(Model::default());
        let a = Elector::start(model.clone(), "a".into(), TIMING);
        a.role()
            .wait_for(|r| matches!(r, Role::Leader(_)))
            .await
            .unwrap();
        let b = Elector::start(model.clone(), "b".into(), TIMING);
        tokio::time::sleep(TIMING.ttl).await;
        assert_eq!(*b.role().borrow(), Role::Standby);
        let resigned = Instant::now();
        a.resign().await;
        b.role()
            .wait_for(|r| matches!(r, Role::Leader(_)))
            .await
            .unwrap();
        // Not at the lease's expiry (up to ttl away), nor at the standby's
        // next try (ttl / 3): at the release's notification.
        assert!(
            resigned.elapsed() < Duration::from_secs(1),
            "{:?}",
            resigned.elapsed()
        );
        let history = model.history.lock();
        assert_eq!(
            history.iter().map(|h| h.1.as_str()).collect::<Vec<_>>(),
            ["a", "b"]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_leader_waking_after_its_deadline_steps_down_without_renewing() {
        let model = Arc::new(Model::default());
        let a = Elector::start(model.clone(), "a".into(), TIMING);
        let mut role = a.role();
        let first = match *role
            .wait_for(|r| matches!(r, Role::Leader(_)))
            .await
            .unwrap()
        {
            Role::Leader(l) => l,
            Role::Standby => unreachable!(),
        };
        // A freeze: the clock jumps past the step-down deadline, not yet
        // past the lease, and no task runs in between (the paused clock
        // moves without yielding). A renewal now would still succeed.
        tokio::time::advance(TIMING.ttl - TIMING.margin() / 2).await;
        // It stepped down instead, and took a fresh lease once the old one
        // expired: no renewal of the first epoch after its deadline.
        tokio::time::timeout(
            TIMING.ttl * 3,
            role.wait_for(|r| matches!(r, Role::Leader(l) if l.epoch > first.epoch)),
        )
        .await
        .expect("never stepped down")
        .unwrap();
        let deadline = first.valid_until - TIMING.margin();
        let late: Vec<_> = model
            .renewals
            .lock()
            .iter()
            .filter(|(epoch, at)| *epoch == first.epoch && *at >= deadline)
            .copied()
            .collect();
        assert!(late.is_empty(), "{late:?}");
        assert_eq!(model.history.lock().len(), 2);
    }
}
