//! A throwaway PKI for the TLS tests: a CA, server and client certificates
//! made at test time (rcgen), written where a server config can name them,
//! and clients that connect over TLS.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, SanType};
use subagentd::pb::agent_service_client::AgentServiceClient;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// A CA that signs certificates.
pub struct Ca {
    pub pem: String,
    issuer: Issuer<'static, KeyPair>,
}

/// A certificate and its private key, PEM.
#[derive(Clone)]
pub struct Pair {
    pub cert: String,
    pub key: String,
}

impl Ca {
    pub fn new(name: &str) -> Self {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let cert = params.self_signed(&key).unwrap();
        Self {
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// A certificate for the test server: `localhost` and 127.0.0.1.
    pub fn server(&self) -> Pair {
        self.leaf(&["localhost", "127.0.0.1"], &[])
    }

    /// A server certificate for the DNS names `names` only.
    pub fn server_named(&self, names: &[&str]) -> Pair {
        self.leaf(names, &[])
    }

    /// A client certificate with the URI SANs `uris` (SPIFFE ids).
    pub fn client(&self, uris: &[&str]) -> Pair {
        self.leaf(&[], uris)
    }

    fn leaf(&self, names: &[&str], uris: &[&str]) -> Pair {
        let key = KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names).unwrap();
        for uri in uris {
            params
                .subject_alt_names
                .push(SanType::URI((*uri).try_into().unwrap()));
        }
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Pair {
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }
}

/// Files a server config names, in a directory of their own.
pub struct Files {
    pub dir: tempfile::TempDir,
}

impl Files {
    pub fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Writes `text` to `name` atomically (a rename, as a Secret update
    /// swaps its files) and returns its path as config text.
    pub fn write(&self, name: &str, text: &str) -> String {
        let tmp = self.path(&format!(".{name}.tmp"));
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, self.path(name)).unwrap();
        self.path(name).display().to_string()
    }

    /// Writes the server's pair and the client CA, and returns the
    /// `[server.tls]` lines naming them.
    pub fn server_tls(&self, server: &Pair, client_ca: Option<&Ca>, client_auth: &str) -> String {
        let cert = self.write("server.crt", &server.cert);
        let key = self.write("server.key", &server.key);
        let mut toml = format!("cert_file = {cert:?}\nkey_file = {key:?}\n");
        if let Some(ca) = client_ca {
            let ca = self.write("client-ca.crt", &ca.pem);
            toml.push_str(&format!(
                "client_ca_file = {ca:?}\nclient_auth = {client_auth:?}\n"
            ));
        }
        toml
    }
}

/// A TLS client trusting `ca`, presenting `identity` if given.
pub async fn connect(
    addr: SocketAddr,
    ca: &Ca,
    identity: Option<&Pair>,
) -> Result<AgentServiceClient<Channel>, tonic::transport::Error> {
    connect_to_name(addr, None, ca, identity).await
}

/// [`connect`], verifying the server's certificate for `name` rather
/// than for the address.
pub async fn connect_to_name(
    addr: SocketAddr,
    name: Option<&str>,
    ca: &Ca,
    identity: Option<&Pair>,
) -> Result<AgentServiceClient<Channel>, tonic::transport::Error> {
    let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&ca.pem));
    if let Some(name) = name {
        tls = tls.domain_name(name);
    }
    if let Some(pair) = identity {
        tls = tls.identity(Identity::from_pem(&pair.cert, &pair.key));
    }
    let channel = Endpoint::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls)?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await?;
    Ok(AgentServiceClient::new(channel))
}
