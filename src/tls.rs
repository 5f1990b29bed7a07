//! TLS on the gRPC listener (`[server.tls]`).
//!
//! The server runs its own acceptor instead of tonic's: tonic builds its
//! rustls config once, while a rotated Kubernetes Secret must take effect
//! without a restart. Each new connection takes the config current at its
//! handshake ([`Acceptor::reload`] swaps it whole), so a reload changes
//! what new connections see and never drops an open one.
//!
//! A verified client certificate's SANs are read once per connection, at
//! the handshake, and travel with every request of that connection as
//! [`PeerInfo`]; `api::auth` maps them to a principal (`[[auth.certs]]`).

use std::{
    io,
    net::SocketAddr,
    path::Path,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use rustls::{
    server::{danger::ClientCertVerifier, WebPkiClientVerifier},
    RootCertStore, ServerConfig,
};
use rustls_pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{TcpListener, TcpStream},
    sync::{mpsc, Semaphore},
};
use tokio_rustls::{server::TlsStream, TlsAcceptor};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::config::{ClientAuth, ServerTls};

/// How often the certificate files are read again: twice within the 10 s
/// in which a rotated Secret must take effect.
pub const TLS_FILES_POLL: Duration = Duration::from_secs(5);

/// A handshake not done by then is dropped (a client that opens a
/// connection and sends nothing holds no slot for long).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Handshakes in progress at once; more connections wait in the kernel's
/// accept queue.
const MAX_HANDSHAKES: usize = 1024;

/// A TLS setup that cannot be used, naming the file and what is wrong.
#[derive(Debug, thiserror::Error)]
#[error("[server.tls] {key} = {path:?}: {problem}")]
pub struct TlsError {
    key: &'static str,
    path: String,
    problem: String,
}

fn tls_error(key: &'static str, path: &str, problem: impl std::fmt::Display) -> TlsError {
    TlsError {
        key,
        path: path.to_owned(),
        problem: problem.to_string(),
    }
}

/// The bytes of the files a `[server.tls]` section names, as read at one
/// moment: what a reload compares to decide whether anything changed.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Files {
    cert: Vec<u8>,
    key: Vec<u8>,
    client_ca: Option<Vec<u8>>,
}

impl Files {
    /// The SANs of the leaf certificate (empty when it cannot be parsed;
    /// `server_config` refuses such a file anyway).
    fn leaf_sans(&self) -> Vec<Arc<str>> {
        CertificateDer::pem_slice_iter(&self.cert)
            .next()
            .and_then(Result::ok)
            .map(|leaf| certificate_sans(leaf.as_ref()))
            .unwrap_or_default()
    }

    fn read(tls: &ServerTls) -> Result<Self, TlsError> {
        let read = |key: &'static str, path: &str| {
            std::fs::read(Path::new(path)).map_err(|e| tls_error(key, path, e))
        };
        Ok(Self {
            cert: read("cert_file", &tls.cert_file)?,
            key: read("key_file", &tls.key_file)?,
            client_ca: if tls.client_ca_file.is_empty() {
                None
            } else {
                Some(read("client_ca_file", &tls.client_ca_file)?)
            },
        })
    }

    fn server_config(&self, tls: &ServerTls) -> Result<ServerConfig, TlsError> {
        let chain = CertificateDer::pem_slice_iter(&self.cert)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| tls_error("cert_file", &tls.cert_file, e))?;
        if chain.is_empty() {
            return Err(tls_error(
                "cert_file",
                &tls.cert_file,
                "holds no PEM certificate",
            ));
        }
        let key = PrivateKeyDer::from_pem_slice(&self.key)
            .map_err(|e| tls_error("key_file", &tls.key_file, e))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| tls_error("cert_file", &tls.cert_file, e))?;
        let builder = match (&self.client_ca, tls.client_auth) {
            (Some(ca), mode) if mode != ClientAuth::None => {
                builder.with_client_cert_verifier(client_verifier(ca, mode, tls, provider)?)
            }
            _ => builder.with_no_client_auth(),
        };
        let mut config = builder
            .with_single_cert(chain, key)
            .map_err(|e| tls_error("key_file", &tls.key_file, e))?;
        // gRPC is HTTP/2 only; clients (grpcio among them) insist on ALPN.
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(config)
    }
}

fn client_verifier(
    ca: &[u8],
    mode: ClientAuth,
    tls: &ServerTls,
    provider: Arc<rustls::crypto::CryptoProvider>,
) -> Result<Arc<dyn ClientCertVerifier>, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca) {
        let cert = cert.map_err(|e| tls_error("client_ca_file", &tls.client_ca_file, e))?;
        roots
            .add(cert)
            .map_err(|e| tls_error("client_ca_file", &tls.client_ca_file, e))?;
    }
    if roots.is_empty() {
        return Err(tls_error(
            "client_ca_file",
            &tls.client_ca_file,
            "holds no PEM certificate",
        ));
    }
    let builder = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
    // Optional: a client may present no certificate, but one it presents
    // is verified like any other.
    let builder = match mode {
        ClientAuth::Optional => builder.allow_unauthenticated(),
        _ => builder,
    };
    builder
        .build()
        .map_err(|e| tls_error("client_ca_file", &tls.client_ca_file, e))
}

/// The TLS config new connections get, and what it was built from.
#[derive(Debug)]
pub struct Acceptor {
    current: ArcSwap<ServerConfig>,
    /// The SANs of the certificate in `current`: a connection presenting
    /// a certificate with one of them is another replica of this service.
    own_sans: ArcSwap<Vec<Arc<str>>>,
    source: Mutex<(ServerTls, Files)>,
    /// Bumped at each change of `current`, so what is derived from the
    /// certificate (a standby's client TLS to the leader) follows it.
    generation: std::sync::atomic::AtomicU64,
}

impl Acceptor {
    /// An acceptor for an enabled, validated `[server.tls]`, its files
    /// read and checked now.
    pub fn new(tls: &ServerTls) -> Result<Self, TlsError> {
        let files = Files::read(tls)?;
        let config = files.server_config(tls)?;
        Ok(Self {
            current: ArcSwap::from_pointee(config),
            own_sans: ArcSwap::from_pointee(files.leaf_sans()),
            source: Mutex::new((tls.clone(), files)),
            generation: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// How many times the certificate in use changed.
    pub fn generation(&self) -> u64 {
        self.generation.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Takes `tls` (a reloaded `[server.tls]`, or the same one when only
    /// its files may have changed) if its files changed and make a usable
    /// config; keeps the one in use otherwise. True when it changed.
    pub fn reload(&self, tls: &ServerTls) -> Result<bool, TlsError> {
        let files = Files::read(tls)?;
        {
            let source = self.source.lock();
            if source.0 == *tls && source.1 == files {
                return Ok(false);
            }
        }
        let config = files.server_config(tls)?;
        self.current.store(Arc::new(config));
        self.own_sans.store(Arc::new(files.leaf_sans()));
        *self.source.lock() = (tls.clone(), files);
        self.generation
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        Ok(true)
    }

    /// Whether a client certificate with `sans` is another replica's: it
    /// carries a name of this server's own certificate (replicas share
    /// one), so its forwarded callers' identities are trusted.
    pub fn is_peer(&self, sans: &[Arc<str>]) -> bool {
        let own = self.own_sans.load();
        sans.iter().any(|san| own.contains(san))
    }

    /// The first DNS name of this server's certificate.
    pub fn own_dns_name(&self) -> Option<Arc<str>> {
        self.own_sans
            .load()
            .iter()
            .find(|san| !san.contains(':') && san.parse::<std::net::IpAddr>().is_err())
            .cloned()
    }

    /// Reads the files again and logs what happened: the periodic check.
    pub fn refresh(&self) {
        let tls = self.source.lock().0.clone();
        match self.reload(&tls) {
            Ok(true) => info!("TLS certificate files changed; new connections use them"),
            Ok(false) => {}
            // Mid-rotation a Secret may briefly hold a new cert with the
            // old key: keep serving with the last good pair.
            Err(e) => warn!(error = %e, "TLS files not usable; keeping the certificate in use"),
        }
    }

    fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.current.load_full())
    }
}

/// The connections of `listener`, past their TLS handshake, until
/// `shutdown`. Handshakes run concurrently (a slow one delays nobody) and
/// a failed one is logged at debug and dropped.
pub fn incoming(
    listener: TcpListener,
    acceptor: Arc<Acceptor>,
    shutdown: CancellationToken,
) -> ReceiverStream<io::Result<TlsConn>> {
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        let handshakes = Arc::new(Semaphore::new(MAX_HANDSHAKES));
        loop {
            let permit = tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tx.closed() => return,
                permit = handshakes.clone().acquire_owned() => permit,
            };
            let Ok(permit) = permit else { return };
            let accepted = tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tx.closed() => return,
                accepted = listener.accept() => accepted,
            };
            let (tcp, remote) = match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors and the like: back off
                    // instead of spinning; the listener stays open.
                    warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            // Without TCP_NODELAY small responses wait for the peer's
            // delayed ACK (Nagle).
            let _ = tcp.set_nodelay(true);
            let acceptor = acceptor.acceptor();
            let tx = tx.clone();
            tokio::spawn(async move {
                let _permit = permit;
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(stream)) => {
                        let conn = TlsConn::new(stream, remote);
                        let _ = tx.send(Ok(conn)).await;
                    }
                    Ok(Err(e)) => debug!(%remote, error = %e, "TLS handshake failed"),
                    Err(_) => debug!(%remote, "TLS handshake timed out"),
                }
            });
        }
    });
    ReceiverStream::new(rx)
}

/// What a request knows of its TLS connection (a request extension).
#[derive(Debug, Clone)]
pub struct PeerInfo {
    /// The client's address.
    pub remote: SocketAddr,
    /// The URI and DNS SANs of its verified certificate; None without one.
    pub sans: Option<Arc<[Arc<str>]>>,
}

/// An accepted TLS connection.
#[derive(Debug)]
pub struct TlsConn {
    stream: TlsStream<TcpStream>,
    peer: PeerInfo,
}

impl TlsConn {
    fn new(stream: TlsStream<TcpStream>, remote: SocketAddr) -> Self {
        let sans = stream
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|chain| chain.first())
            .map(|leaf| certificate_sans(leaf.as_ref()).into());
        Self {
            stream,
            peer: PeerInfo { remote, sans },
        }
    }
}

/// The URI and DNS-name SANs of a DER certificate (rustls has verified
/// it; a SAN extension it cannot parse yields none).
pub fn certificate_sans(der: &[u8]) -> Vec<Arc<str>> {
    use x509_parser::extensions::GeneralName;
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
        return Vec::new();
    };
    let Ok(Some(san)) = cert.subject_alternative_name() else {
        return Vec::new();
    };
    san.value
        .general_names
        .iter()
        .filter_map(|name| match name {
            GeneralName::URI(uri) => Some(Arc::from(*uri)),
            GeneralName::DNSName(dns) => Some(Arc::from(*dns)),
            _ => None,
        })
        .collect()
}

impl tonic::transport::server::Connected for TlsConn {
    type ConnectInfo = PeerInfo;

    fn connect_info(&self) -> PeerInfo {
        self.peer.clone()
    }
}

impl AsyncRead for TlsConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsConn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// What a client (the CLI, a standby forwarding to its leader) needs for
/// TLS: the CA to verify the server with (None: the public web roots) and
/// the client certificate to present, if any.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientTls {
    /// PEM CA certificates the server's chain must lead to.
    pub ca_file: Option<String>,
    /// PEM client certificate chain, with `key_file`.
    pub cert_file: Option<String>,
    /// Its private key.
    pub key_file: Option<String>,
}

/// A client-side TLS setup that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ClientTlsError {
    /// A file that cannot be read.
    #[error("cannot read {flag} {path:?}: {source}")]
    Read {
        /// The flag or key naming it.
        flag: &'static str,
        /// Its path.
        path: String,
        /// Why.
        source: io::Error,
    },
    /// A certificate without its key or the other way round.
    #[error("--cert-file and --key-file go together")]
    Unpaired,
}

impl ClientTls {
    /// Whether anything asks for TLS.
    pub fn any(&self) -> bool {
        self.ca_file.is_some() || self.cert_file.is_some() || self.key_file.is_some()
    }

    /// tonic's client config for this setup.
    pub fn config(&self) -> Result<tonic::transport::ClientTlsConfig, ClientTlsError> {
        let read = |flag: &'static str, path: &str| {
            std::fs::read(path).map_err(|source| ClientTlsError::Read {
                flag,
                path: path.to_owned(),
                source,
            })
        };
        let mut config = tonic::transport::ClientTlsConfig::new();
        config = match &self.ca_file {
            Some(ca) => config.ca_certificate(tonic::transport::Certificate::from_pem(read(
                "--ca-file",
                ca,
            )?)),
            None => config.with_webpki_roots(),
        };
        match (&self.cert_file, &self.key_file) {
            (Some(cert), Some(key)) => {
                config = config.identity(tonic::transport::Identity::from_pem(
                    read("--cert-file", cert)?,
                    read("--key-file", key)?,
                ));
            }
            (None, None) => {}
            _ => return Err(ClientTlsError::Unpaired),
        }
        Ok(config)
    }
}

/// The metrics endpoint's listener with `[telemetry] metrics_tls`: the
/// gRPC listener's certificate, offered for HTTP/1.1. Handshakes are done
/// one at a time (scrapes are rare), each bounded by a timeout.
#[derive(Debug)]
pub struct Http1Listener {
    tcp: TcpListener,
    acceptor: Arc<Acceptor>,
}

impl Http1Listener {
    /// Serves TLS on `tcp` with what `acceptor` holds at each connection.
    pub fn new(tcp: TcpListener, acceptor: Arc<Acceptor>) -> Self {
        Self { tcp, acceptor }
    }
}

impl axum::serve::Listener for Http1Listener {
    type Io = TlsStream<TcpStream>;
    /// The peer, with its verified client certificate's SANs (`/mcp`
    /// authenticates by them).
    type Addr = PeerInfo;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let (tcp, remote) = match self.tcp.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    warn!(error = %e, "accepting a metrics connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let mut config = (*self.acceptor.current.load_full()).clone();
            config.alpn_protocols = vec![b"http/1.1".to_vec()];
            let acceptor = TlsAcceptor::from(Arc::new(config));
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => {
                    let conn = TlsConn::new(stream, remote);
                    return (conn.stream, conn.peer);
                }
                Ok(Err(e)) => debug!(%remote, error = %e, "metrics TLS handshake failed"),
                Err(_) => debug!(%remote, "metrics TLS handshake timed out"),
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(PeerInfo {
            remote: self.tcp.local_addr()?,
            sans: None,
        })
    }
}

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, Http1Listener>>
    for PeerInfo
{
    fn connect_info(stream: axum::serve::IncomingStream<'_, Http1Listener>) -> Self {
        stream.remote_addr().clone()
    }
}
