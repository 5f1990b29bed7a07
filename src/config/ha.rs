//! `[ha]`: leader election among servers on one PostgreSQL store.

use std::{net::SocketAddr, time::Duration};

use serde::{Deserialize, Serialize};

use super::error::{invalid, ConfigError};

/// Default `[ha] lease_ttl`.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(10);
/// The shortest `[ha] lease_ttl`: a shorter lease would be lost to one
/// slow database round trip.
pub const MIN_LEASE_TTL: Duration = Duration::from_secs(1);

/// `[ha]` section: how servers sharing one PostgreSQL store elect the one
/// that schedules (the leader) and reach it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HaConfig {
    /// How long a leader's lease lasts unless renewed. Every election
    /// timer derives from it. Default 10 s, at least 1 s.
    #[serde(with = "humantime_serde")]
    pub lease_ttl: Duration,
    /// `host:port` at which the other servers reach this one when it
    /// leads. Empty (default): `$POD_IP:<listen port>` when `POD_IP` is
    /// set, otherwise the listen address.
    pub advertise_address: String,
    /// With `[server.tls]`: the CA a standby verifies the leader's
    /// certificate with. Empty (default): `[server.tls] client_ca_file`,
    /// else the public web roots.
    pub tls_ca_file: String,
    /// With `[server.tls]`: the name the leader's certificate must carry.
    /// Empty (default): the first DNS name of this server's own
    /// certificate (replicas share one), else the advertised host.
    pub tls_server_name: String,
}

impl Default for HaConfig {
    fn default() -> Self {
        Self {
            lease_ttl: DEFAULT_LEASE_TTL,
            advertise_address: String::new(),
            tls_ca_file: String::new(),
            tls_server_name: String::new(),
        }
    }
}

impl HaConfig {
    /// Checks every rule; errors name the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.lease_ttl < MIN_LEASE_TTL {
            return Err(invalid(
                "ha.lease_ttl",
                format!(
                    "must be ≥ 1s (got {})",
                    humantime::format_duration(self.lease_ttl)
                ),
            ));
        }
        if !self.advertise_address.is_empty() && !is_host_port(&self.advertise_address) {
            return Err(invalid(
                "ha.advertise_address",
                format!("must be host:port (got {:?})", self.advertise_address),
            ));
        }
        Ok(())
    }

    /// Where other servers reach this one: `advertise_address`, else
    /// `$POD_IP:<port of listen>` when `pod_ip` (the `POD_IP` variable) is
    /// set, else `listen` itself.
    pub fn advertised(&self, listen: SocketAddr, pod_ip: Option<&str>) -> String {
        if !self.advertise_address.is_empty() {
            return self.advertise_address.clone();
        }
        match pod_ip.map(str::trim).filter(|ip| !ip.is_empty()) {
            // An IPv6 pod address needs brackets before its port.
            Some(ip) if ip.contains(':') => format!("[{ip}]:{}", listen.port()),
            Some(ip) => format!("{ip}:{}", listen.port()),
            None => listen.to_string(),
        }
    }
}

/// `host:port` with a non-empty host (a name, an IPv4 address or a
/// bracketed IPv6 one) and a port number.
fn is_host_port(s: &str) -> bool {
    let Some((host, port)) = s.rsplit_once(':') else {
        return false;
    };
    let host_ok = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) => v6.parse::<std::net::Ipv6Addr>().is_ok(),
        None => {
            !host.is_empty()
                && host
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '_')
        }
    };
    host_ok && port.parse::<u16>().is_ok_and(|p| p > 0)
}
