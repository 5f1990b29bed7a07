//! The authentication layer: every call but health and reflection gets its
//! principal here, from the `authorization` header, and is checked against
//! the role policy before anything else sees it (a standby too, before it
//! forwards: the leader then authenticates the same header again).
//!
//! The principal travels in the request's extensions, where handlers read
//! it with [`principal`]; a streaming call's also carry a [`Revocation`]
//! ([`revocation`]), so the stream ends when its key is removed.

use std::{
    sync::Arc,
    task::{Context, Poll},
};

use tonic::body::Body;
use tower::{Layer, Service};

use crate::auth::{
    policy, AuthError, Credential, Principal, Revocation, Role, SharedAuthenticator,
};
use crate::scheduler::Scope;
use crate::tls::{Acceptor, PeerInfo};

/// The header in which a standby passes on the SANs of its caller's
/// client certificate (space-separated), when the caller authenticated by
/// certificate: the leader, which sees the standby's certificate, trusts
/// it only from another replica (`tls::Acceptor::is_peer`).
pub const FORWARDED_SANS_HEADER: &str = "subagentd-forwarded-sans";
/// The header names this layer reads on every call, parsed once: a lookup
/// by `&str` parses the name first.
const FORWARDED_SANS: http::HeaderName = http::HeaderName::from_static(FORWARDED_SANS_HEADER);
const TENANT: http::HeaderName = http::HeaderName::from_static(crate::auth::jwt::TENANT_HEADER);
/// The calls that stay open: they end when their credential is revoked.
const LONG_LIVED: &[&str] = &[
    "/subagents.v1.AgentService/WatchAgents",
    "/subagents.v1.WorkerService/Connect",
];

/// The layer (see the module docs).
#[derive(Debug, Clone)]
pub struct AuthLayer {
    auth: SharedAuthenticator,
    tls: Option<Arc<Acceptor>>,
}

impl AuthLayer {
    /// Checks calls with whatever `auth` holds at the time of each call;
    /// `tls` (the listener's) tells the other replicas' connections apart.
    pub fn new(auth: SharedAuthenticator, tls: Option<Arc<Acceptor>>) -> Self {
        Self { auth, tls }
    }
}

/// The client-certificate SANs a call authenticated with (a request
/// extension): its own connection's, or, for a call another replica
/// forwarded, its original caller's. A standby passes them on.
#[derive(Debug, Clone)]
pub struct CallerSans(pub Arc<[Arc<str>]>);

impl<S> Layer<S> for AuthLayer {
    type Service = AuthService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        AuthService {
            inner,
            auth: self.auth.clone(),
            tls: self.tls.clone(),
        }
    }
}

/// The service [`AuthLayer`] wraps around the server's routes.
#[derive(Debug, Clone)]
pub struct AuthService<S> {
    inner: S,
    auth: SharedAuthenticator,
    tls: Option<Arc<Acceptor>>,
}

impl<S> AuthService<S> {
    /// The client-certificate SANs that speak for `req`: those another
    /// replica forwarded, when the connection is one; else the
    /// connection's own. A forwarded-SANs header from anyone else is
    /// ignored.
    fn caller_sans(&self, req: &http::Request<Body>) -> Option<Arc<[Arc<str>]>> {
        let own = req
            .extensions()
            .get::<PeerInfo>()
            .and_then(|peer| peer.sans.clone());
        let forwarded = req.headers().get(FORWARDED_SANS);
        match (own, forwarded, &self.tls) {
            (Some(own), Some(forwarded), Some(tls)) if tls.is_peer(&own) => {
                let sans: Vec<Arc<str>> = forwarded
                    .to_str()
                    .ok()?
                    .split_ascii_whitespace()
                    .map(Arc::from)
                    .collect();
                Some(sans.into())
            }
            (own, _, _) => own,
        }
    }
}

impl<S> AuthService<S> {
    /// Authenticates and authorizes `req`, putting its principal (and for
    /// a long-lived call its [`Revocation`]) into its extensions.
    fn admit(&self, req: &mut http::Request<Body>) -> Result<(), AuthError> {
        let path = req.uri().path();
        let long_lived = LONG_LIVED.contains(&path);
        let sans = self.caller_sans(req);
        let credential = Credential {
            authorization: req
                .headers()
                .get(http::header::AUTHORIZATION)
                .map(|v| v.as_bytes()),
            peer_sans: sans.as_deref(),
            tenant: req.headers().get(TENANT).map(|v| v.as_bytes()),
        };
        let auth = self.auth.load();
        let principal = auth.check(credential, path)?;
        let revocation =
            (long_lived && auth.required()).then(|| self.auth.follow(credential, &principal));
        let extensions = req.extensions_mut();
        if let Some(revocation) = revocation {
            extensions.insert(revocation);
        }
        if let Some(sans) = sans {
            extensions.insert(CallerSans(sans));
        }
        extensions.insert(principal);
        Ok(())
    }
}

/// How long a call signed by an unknown JWT key waits for the early
/// JWKS fetch it asked for.
const EARLY_FETCH_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

type BoxFuture<T, E> = std::pin::Pin<Box<dyn std::future::Future<Output = Result<T, E>> + Send>>;

impl<S> Service<http::Request<Body>> for AuthService<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = futures_util::future::Either<
        futures_util::future::Either<
            S::Future,
            std::future::Ready<Result<http::Response<Body>, S::Error>>,
        >,
        BoxFuture<http::Response<Body>, S::Error>,
    >;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<Body>) -> Self::Future {
        use futures_util::future::Either;
        if policy::is_open(req.uri().path()) {
            return Either::Left(Either::Left(self.inner.call(req)));
        }
        let refuse = |e: AuthError| Ok(tonic::Status::from(e).into_http());
        match self.admit(&mut req) {
            Ok(()) => Either::Left(Either::Left(self.inner.call(req))),
            Err(AuthError::UnknownSigningKey) => {
                // A key the JWKS does not hold yet (the issuer rotated):
                // fetch it early, at most once a minute, and try again.
                let fetched = self
                    .auth
                    .load()
                    .jwt()
                    .and_then(|verifier| verifier.request_early_fetch());
                let Some(mut fetched) = fetched else {
                    return Either::Left(Either::Right(std::future::ready(refuse(
                        AuthError::UnknownSigningKey,
                    ))));
                };
                // The service that was made ready goes with the call.
                let ready = self.inner.clone();
                let mut inner = std::mem::replace(&mut self.inner, ready);
                let this = AuthService {
                    inner: (),
                    auth: self.auth.clone(),
                    tls: self.tls.clone(),
                };
                Either::Right(Box::pin(async move {
                    let _ = tokio::time::timeout(EARLY_FETCH_WAIT, fetched.changed()).await;
                    match this.admit(&mut req) {
                        Ok(()) => inner.call(req).await,
                        Err(e) => refuse(e),
                    }
                }))
            }
            Err(e) => Either::Left(Either::Right(std::future::ready(refuse(e)))),
        }
    }
}

/// The caller of a request that passed [`AuthLayer`]; the anonymous
/// principal when the layer is not in front (in-process tests of a
/// service).
pub fn principal<T>(request: &tonic::Request<T>) -> Principal {
    request
        .extensions()
        .get::<Principal>()
        .cloned()
        .unwrap_or_else(Principal::anonymous)
}

/// The credential of a long-lived call, watched for revocation; None
/// without authentication.
pub fn revocation<T>(request: &tonic::Request<T>) -> Option<Revocation> {
    request.extensions().get::<Revocation>().cloned()
}

/// Resolves, with the refusal, when `revocation`'s credential is no
/// longer accepted; never without one.
pub async fn revoked(revocation: &mut Option<Revocation>) -> AuthError {
    match revocation {
        Some(r) => r.revoked().await,
        None => std::future::pending().await,
    }
}

/// Whose agents `principal` may find by id and act on: an admin every
/// tenant's, anyone else only its own.
pub fn scope_of(principal: &Principal) -> Scope {
    if principal.roles.has(Role::Admin) {
        Scope::All
    } else {
        Scope::Tenant(principal.tenant.clone())
    }
}

/// Whether `principal` may Await with `collect` ([`policy::AWAIT_COLLECT`]).
///
/// [`policy::AWAIT_COLLECT`]: crate::auth::policy::AWAIT_COLLECT
pub fn may_collect(principal: &Principal) -> Result<(), AuthError> {
    let roles = crate::auth::policy::AWAIT_COLLECT;
    if roles.iter().any(|r| principal.roles.has(*r)) {
        Ok(())
    } else {
        Err(AuthError::PermissionDenied {
            method: "/subagents.v1.AgentService/Await (collect)".to_owned(),
            required: roles,
        })
    }
}

/// The tenant a Status or WatchAgents listing of `principal` covers, given
/// the request's `tenant` field (`requested`, empty = unset): an admin's
/// every tenant unless it names one; anyone else's only its own, and
/// naming another is PERMISSION_DENIED.
pub fn listed_tenant(
    principal: &Principal,
    requested: &str,
    method: &'static str,
) -> Result<Option<Arc<str>>, AuthError> {
    if principal.roles.has(Role::Admin) {
        Ok((!requested.is_empty()).then(|| Arc::from(requested)))
    } else if requested.is_empty() || *requested == *principal.tenant {
        Ok(Some(principal.tenant.clone()))
    } else {
        Err(AuthError::PermissionDenied {
            method: method.to_owned(),
            required: &[Role::Admin],
        })
    }
}
