//! What both clients of a server share — the `subagentd` client
//! subcommands and `subagentd worker`: the address, the credential and TLS
//! to reach it with. Neither imports `api` or `server`.

/// Server address used when neither `--addr` nor `SUBAGENTD_ADDR` is set.
pub const DEFAULT_ADDR: &str = "http://127.0.0.1:50051";

/// The largest response a client accepts: tonic's default of 4 MiB is too
/// small for a `status` page of up to 1000 agents that each carry their
/// result.
pub const MAX_RESPONSE_BYTES: usize = 256 * 1024 * 1024;

/// Adds `http://` when the address has no scheme, so `127.0.0.1:50051` works
/// as well as the full URL that tonic requires.
pub fn normalize_addr(addr: &str) -> String {
    let addr = addr.trim();
    if addr.contains("://") {
        addr.to_owned()
    } else {
        format!("http://{addr}")
    }
}

/// The `authorization` value a client sends for `token` (`--token`,
/// `SUBAGENTD_TOKEN`); None for no token. Err when the token holds
/// characters a header cannot carry.
pub fn bearer_header(
    token: Option<&str>,
) -> Result<Option<tonic::metadata::AsciiMetadataValue>, InvalidToken> {
    match token.map(str::trim) {
        None | Some("") => Ok(None),
        Some(token) => format!("Bearer {token}")
            .parse()
            .map(Some)
            .map_err(|_| InvalidToken),
    }
}

/// A token that cannot be sent as a header.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("the API key (--token or SUBAGENTD_TOKEN) contains characters a header cannot carry")]
pub struct InvalidToken;

/// Adds the caller's credential to every call.
#[derive(Debug, Clone)]
pub struct Credential(pub Option<tonic::metadata::AsciiMetadataValue>);

impl tonic::service::Interceptor for Credential {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        Ok(request)
    }
}

/// TLS flags of the client subcommands and `subagentd worker`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct TlsArgs {
    /// PEM CA certificate(s) to verify the server's TLS certificate with;
    /// implies TLS. With an https:// address and no CA file, the public
    /// web roots are used.
    #[arg(long, env = "SUBAGENTD_CA_FILE", value_name = "PEM")]
    pub ca_file: Option<String>,
    /// PEM client certificate to present (mTLS), with --key-file.
    #[arg(
        long,
        env = "SUBAGENTD_CERT_FILE",
        value_name = "PEM",
        requires = "key_file"
    )]
    pub cert_file: Option<String>,
    /// The private key of --cert-file.
    #[arg(
        long,
        env = "SUBAGENTD_KEY_FILE",
        value_name = "PEM",
        requires = "cert_file"
    )]
    pub key_file: Option<String>,
}

impl TlsArgs {
    /// `url` with TLS applied: https when a TLS flag is given, and the
    /// config for an https endpoint (its CA and client certificate).
    pub fn secure(
        &self,
        url: String,
    ) -> Result<(String, Option<tonic::transport::ClientTlsConfig>), crate::tls::ClientTlsError>
    {
        let tls = crate::tls::ClientTls {
            ca_file: self.ca_file.clone(),
            cert_file: self.cert_file.clone(),
            key_file: self.key_file.clone(),
        };
        let url = match url.strip_prefix("http://") {
            // A CA or client certificate given means TLS.
            Some(rest) if tls.any() => format!("https://{rest}"),
            _ => url,
        };
        let config = url
            .starts_with("https://")
            .then(|| tls.config())
            .transpose()?;
        Ok((url, config))
    }
}

#[cfg(test)]
mod tests {
    use tonic::transport::Endpoint;

    use super::*;
    #[test]
    fn normalize_addr_adds_http_only_when_there_is_no_scheme() {
        assert_eq!(normalize_addr("127.0.0.1:50051"), "http://127.0.0.1:50051");
        assert_eq!(normalize_addr("localhost:1"), "http://localhost:1");
        assert_eq!(normalize_addr("[::1]:50051"), "http://[::1]:50051");
        assert_eq!(normalize_addr(" http://h:1 "), "http://h:1");
        assert_eq!(normalize_addr("https://h:443"), "https://h:443");
        assert_eq!(normalize_addr(DEFAULT_ADDR), DEFAULT_ADDR);
    }

    #[test]
    fn normalized_addresses_are_valid_endpoints() {
        for addr in ["127.0.0.1:50051", "localhost:1", "[::1]:50051"] {
            Endpoint::from_shared(normalize_addr(addr)).unwrap();
        }
    }
}
