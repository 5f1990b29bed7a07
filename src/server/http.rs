//! The `[http]` listener: MCP's streamable HTTP transport at `/mcp`.
//!
//! Every request is authenticated as a gRPC call is (the `authorization`
//! header: an API key, a JWT, a run token) and answered 401 without a valid
//! one. The tools then reach the service through its own gRPC listener
//! with that same credential, so roles, tenants, the policy table and a
//! standby's forwarding apply unchanged: `/mcp` can do nothing the caller's
//! credential could not do over gRPC.
//!
//! The lead is the `subagentd-lead-id` header, else the credential's
//! principal name (without authentication: `mcp-http`, one lead shared by
//! every caller).

use std::{net::SocketAddr, sync::Arc, time::Duration};

use anyhow::Context as _;
use axum::{
    extract::{Request, State},
    middleware::Next,
    response::{IntoResponse, Response},
};
use futures_util::future::BoxFuture;
use rmcp::transport::streamable_http_server::{
    session::local::LocalSessionManager, StreamableHttpServerConfig, StreamableHttpService,
};
use tokio::{net::TcpListener, task::JoinHandle};
use tokio_util::sync::CancellationToken;
use tonic::{metadata::AsciiMetadataValue, transport::Channel};
use tracing::error;

use crate::{
    auth::{Credential, SharedAuthenticator},
    config::Config,
    mcp::{LeadServer, Owner, Session, SessionSource, Settings, Tools},
};

/// The header that names the lead of an `/mcp` request.
pub const LEAD_HEADER: &str = "subagentd-lead-id";
/// The lead of `/mcp` requests without authentication or a lead header.
pub const SHARED_LEAD: &str = "mcp-http";

use crate::auth::jwt::TENANT_HEADER;

/// Serves `/mcp` on `[http] listen` until `shutdown`; its bound address,
/// or None when it is off. Calls reach the gRPC API at `grpc` (this
/// server's own listener).
pub(super) async fn serve(
    config: &Config,
    grpc: SocketAddr,
    authenticator: SharedAuthenticator,
    tls: &Option<Arc<crate::tls::Acceptor>>,
    shutdown: &CancellationToken,
    tasks: &mut Vec<JoinHandle<()>>,
) -> anyhow::Result<Option<SocketAddr>> {
    let Some(listen) = config.http.listen_addr() else {
        return Ok(None);
    };
    let listener = TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen} ([http] listen)"))?;
    let bound = listener.local_addr()?;
    let sessions = Arc::new(HttpSessions {
        channel: own_channel(config, grpc, tls)?,
        authenticator: authenticator.clone(),
        settings: parking_lot::Mutex::new(None),
    });
    let mut mcp_config = StreamableHttpServerConfig::default()
        .with_sse_keep_alive(Some(Duration::from_secs(15)))
        .with_cancellation_token(shutdown.child_token());
    // Off loopback the Host check would refuse every real host name. DNS
    // rebinding needs a browser, and every request a browser sends carries
    // `Origin`, which `authenticate` refuses; off loopback without
    // authentication also needs an explicit opt-out.
    if !listen.ip().is_loopback() {
        mcp_config = mcp_config.disable_allowed_hosts();
    }
    let service = StreamableHttpService::new(
        move || Ok(LeadServer::new(sessions.clone())),
        LocalSessionManager::default().into(),
        mcp_config,
    );
    let app = axum::Router::new().nest_service("/mcp", service).layer(
        axum::middleware::from_fn_with_state(authenticator, authenticate),
    );
    let tls = tls.clone().filter(|_| config.http.tls);
    let shutdown = shutdown.clone();
    tasks.push(tokio::spawn(async move {
        let served = match tls {
            Some(acceptor) => {
                // Each request knows its connection's client certificate.
                let app = app.into_make_service_with_connect_info::<crate::tls::PeerInfo>();
                axum::serve(crate::tls::Http1Listener::new(listener, acceptor), app)
                    .with_graceful_shutdown(shutdown.cancelled_owned())
                    .await
            }
            None => {
                axum::serve(listener, app)
                    .with_graceful_shutdown(shutdown.cancelled_owned())
                    .await
            }
        };
        if let Err(e) = served {
            error!(error = %e, "the [http] listener stopped");
        }
    }));
    Ok(Some(bound))
}

/// Refuses a request from a web page (one with `Origin`: agent hosts send
/// none, and a page must not reach the tools through the user's network,
/// as the MCP spec asks), 403; and one whose credential the gRPC API would
/// refuse: 401 with the cause, as the MCP authorization spec expects of an
/// HTTP server.
async fn authenticate(
    State(authenticator): State<SharedAuthenticator>,
    request: Request,
    next: Next,
) -> Response {
    let headers = request.headers();
    if let Some(origin) = headers.get(http::header::ORIGIN) {
        return (
            http::StatusCode::FORBIDDEN,
            format!(
                "requests from web pages are refused (Origin: {})\n",
                String::from_utf8_lossy(origin.as_bytes())
            ),
        )
            .into_response();
    }
    let credential = Credential {
        authorization: headers
            .get(http::header::AUTHORIZATION)
            .map(|v| v.as_bytes()),
        peer_sans: None,
        tenant: headers.get(TENANT_HEADER).map(|v| v.as_bytes()),
    };
    let sans = peer_sans(request.extensions());
    let credential = Credential {
        peer_sans: sans.as_deref(),
        ..credential
    };
    match authenticator.load().authenticate_call(credential) {
        Ok(_) => next.run(request).await,
        Err(e) => (
            http::StatusCode::UNAUTHORIZED,
            [(http::header::WWW_AUTHENTICATE, "Bearer")],
            format!("{e}\n"),
        )
            .into_response(),
    }
}

/// The SANs of the request's verified client certificate, if it came over
/// TLS with one.
fn peer_sans(extensions: &http::Extensions) -> Option<Arc<[Arc<str>]>> {
    extensions
        .get::<axum::extract::ConnectInfo<crate::tls::PeerInfo>>()
        .and_then(|info| info.0.sans.clone())
}

/// A channel to this server's own gRPC listener: over loopback when it
/// listens on every address, with TLS when it serves TLS (verified with
/// `[ha] tls_ca_file`, else `[server.tls] client_ca_file`, else the web
/// roots, for the certificate's own DNS name). It presents no client
/// certificate: each call speaks with its caller's bearer credential.
fn own_channel(
    config: &Config,
    grpc: SocketAddr,
    tls: &Option<Arc<crate::tls::Acceptor>>,
) -> anyhow::Result<Channel> {
    let mut addr = grpc;
    if addr.ip().is_unspecified() {
        addr.set_ip(match addr {
            SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    let scheme = if tls.is_some() { "https" } else { "http" };
    let mut endpoint = tonic::transport::Endpoint::from_shared(format!("{scheme}://{addr}"))?
        .connect_timeout(Duration::from_secs(5));
    if let Some(acceptor) = tls {
        let ca = [&config.ha.tls_ca_file, &config.server.tls.client_ca_file]
            .into_iter()
            .find(|f| !f.is_empty())
            .cloned();
        // Presenting this server's own certificate, as a standby does to
        // its leader: the gRPC listener then trusts the client-certificate
        // SANs a call forwards (`api::auth::FORWARDED_SANS_HEADER`), and a
        // bearer credential still speaks for its call.
        let mut client = crate::tls::ClientTls {
            ca_file: ca,
            cert_file: Some(config.server.tls.cert_file.clone()),
            key_file: Some(config.server.tls.key_file.clone()),
        }
        .config()
        .context("TLS from /mcp to this server's gRPC listener")?;
        if let Some(name) = acceptor.own_dns_name() {
            client = client.domain_name(name.to_string());
        }
        endpoint = endpoint.tls_config(client)?;
    }
    Ok(endpoint.connect_lazy())
}

/// The tools of each `/mcp` request: its credential and lead, and the
/// server's configuration as GetServerInfo reads it with that credential.
struct HttpSessions {
    channel: Channel,
    authenticator: SharedAuthenticator,
    /// The server's configuration as GetServerInfo last answered it (the
    /// same for every caller), and when: read again after
    /// [`SETTINGS_TTL`], so a request costs no extra call.
    settings: parking_lot::Mutex<Option<(std::time::Instant, Settings)>>,
}

/// How long `/mcp` keeps the server's configuration.
const SETTINGS_TTL: Duration = Duration::from_secs(30);

impl SessionSource for HttpSessions {
    fn tools(&self, parts: Option<&http::request::Parts>) -> BoxFuture<'_, Result<Tools, String>> {
        let headers = parts.map(|p| p.headers.clone()).unwrap_or_default();
        let sans = parts.and_then(|p| peer_sans(&p.extensions));
        Box::pin(async move {
            let authorization = headers.get(http::header::AUTHORIZATION);
            let credential = authorization
                .map(|v| AsciiMetadataValue::try_from(v.as_bytes()))
                .transpose()
                .map_err(|_| "the authorization header is not ASCII".to_owned())?;
            let tenant = headers
                .get(TENANT_HEADER)
                .map(|v| AsciiMetadataValue::try_from(v.as_bytes()))
                .transpose()
                .map_err(|_| format!("the {TENANT_HEADER} header is not ASCII"))?;
            let owner = match headers.get(LEAD_HEADER).and_then(|v| v.to_str().ok()) {
                Some(lead) if !lead.trim().is_empty() => Owner::Lead(lead.trim().to_owned()),
                _ => self.principal_owner(&headers, sans.as_deref()),
            };
            let mut session =
                Session::new(self.channel.clone(), credential, owner).with_tenant(tenant);
            if let Some(sans) = sans {
                let joined = sans.iter().map(|s| &**s).collect::<Vec<_>>().join(" ");
                let value = AsciiMetadataValue::try_from(joined)
                    .map_err(|_| "a client certificate SAN is not ASCII".to_owned())?;
                session = session.with_header(crate::api::auth::FORWARDED_SANS_HEADER, value);
            }
            let cached = self.settings.lock().clone();
            let settings = match cached {
                Some((read, settings)) if read.elapsed() < SETTINGS_TTL => settings,
                _ => {
                    // With the caller's credential: one that may not even
                    // read the configuration is refused here.
                    let info = session
                        .server_info()
                        .await
                        .map_err(|s| crate::mcp::refusal::refusal_text(&s))?;
                    let settings = Settings::from_server_info(&info);
                    *self.settings.lock() = Some((std::time::Instant::now(), settings.clone()));
                    settings
                }
            };
            Ok(Tools { settings, session })
        })
    }
}

impl HttpSessions {
    /// The owner of a request without a lead header: a run's own agent for
    /// its run credential (so its spawns are its children, as over stdio),
    /// else the lead named by the principal, or the shared lead without
    /// authentication.
    fn principal_owner(&self, headers: &http::HeaderMap, sans: Option<&[Arc<str>]>) -> Owner {
        let authenticator = self.authenticator.load();
        if !authenticator.required() {
            return Owner::Lead(SHARED_LEAD.to_owned());
        }
        let credential = Credential {
            authorization: headers
                .get(http::header::AUTHORIZATION)
                .map(|v| v.as_bytes()),
            peer_sans: sans,
            tenant: headers.get(TENANT_HEADER).map(|v| v.as_bytes()),
        };
        let name = authenticator
            .authenticate_call(credential)
            .map_or_else(|_| SHARED_LEAD.to_owned(), |p| p.name.to_string());
        match name.strip_prefix(crate::auth::run_tokens::PRINCIPAL_PREFIX) {
            Some(agent) => Owner::Agent(agent.to_owned()),
            None => Owner::Lead(name),
        }
    }
}
