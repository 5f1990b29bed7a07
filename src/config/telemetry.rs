//! `[telemetry]`: traces, metrics and logs.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use super::error::{invalid, ConfigError};

/// Default `[telemetry] metrics_listen`.
pub const DEFAULT_METRICS_LISTEN: &str = "127.0.0.1:9464";
/// Default `[telemetry] service_name`.
pub const DEFAULT_SERVICE_NAME: &str = "subagentd";
/// Default `[telemetry] traces_sampler` (the OpenTelemetry default).
pub const DEFAULT_TRACES_SAMPLER: &str = "parentbased_always_on";
/// Samplers `[telemetry] traces_sampler` accepts (the standard
/// `OTEL_TRACES_SAMPLER` values this server implements).
pub const TRACES_SAMPLERS: &[&str] = &[
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
];
/// The standard OpenTelemetry variables and the `[telemetry]` keys they
/// set. They override the file; `SUBAGENTD_TELEMETRY__*` overrides them.
pub const OTEL_ENV: &[(&str, &str)] = &[
    ("OTEL_EXPORTER_OTLP_ENDPOINT", "otlp_endpoint"),
    ("OTEL_SERVICE_NAME", "service_name"),
    ("OTEL_RESOURCE_ATTRIBUTES", "resource_attributes"),
    ("OTEL_TRACES_SAMPLER", "traces_sampler"),
    ("OTEL_TRACES_SAMPLER_ARG", "traces_sampler_arg"),
];

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// One human-readable line per event (colours on a terminal).
    #[default]
    Pretty,
    /// One JSON object per line, with trace and span ids.
    Json,
}

/// `[telemetry]` section. The first five keys mirror the standard
/// OpenTelemetry variables, which override them (see [`OTEL_ENV`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// OTLP/gRPC collector address, e.g. `http://otel-collector:4317`
    /// (`OTEL_EXPORTER_OTLP_ENDPOINT`). Empty (default): no spans are
    /// exported and nothing else changes.
    pub otlp_endpoint: String,
    /// `service.name` of the exported spans (`OTEL_SERVICE_NAME`).
    pub service_name: String,
    /// More resource attributes, `key=value,key=value`
    /// (`OTEL_RESOURCE_ATTRIBUTES`).
    pub resource_attributes: String,
    /// Sampler (`OTEL_TRACES_SAMPLER`): one of [`TRACES_SAMPLERS`].
    pub traces_sampler: String,
    /// Sampler argument, the ratio for the `*traceidratio` samplers
    /// (`OTEL_TRACES_SAMPLER_ARG`); empty = 1.0. A number or a string.
    #[serde(deserialize_with = "string_or_number")]
    pub traces_sampler_arg: String,
    /// Address of the Prometheus endpoint (`GET /metrics`); empty = off.
    pub metrics_listen: String,
    /// A file holding the token `GET /metrics` must present as
    /// `authorization: Bearer <token>`; re-read on every change. Empty
    /// (default): no token asked for.
    pub metrics_token_file: String,
    /// Serve the metrics endpoint over TLS with `[server.tls]`'s
    /// certificate and client-certificate rules. Default false.
    pub metrics_tls: bool,
    /// `pretty` or `json`. The level comes from `RUST_LOG` (default info).
    pub log_format: LogFormat,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        Self {
            otlp_endpoint: String::new(),
            service_name: DEFAULT_SERVICE_NAME.to_owned(),
            resource_attributes: String::new(),
            traces_sampler: DEFAULT_TRACES_SAMPLER.to_owned(),
            traces_sampler_arg: String::new(),
            metrics_listen: DEFAULT_METRICS_LISTEN.to_owned(),
            metrics_token_file: String::new(),
            metrics_tls: false,
            log_format: LogFormat::Pretty,
        }
    }
}

/// A broken `[telemetry]` rule, naming the places the value may come from
/// (an operator may have set it through the standard variable).
fn telemetry_invalid(key: &str, rule: impl Into<String>) -> ConfigError {
    let rule = rule.into();
    let rule = match OTEL_ENV.iter().find(|(_, k)| *k == key) {
        Some((var, _)) => format!(
            "{rule} (set in the file, by {var}, or by SUBAGENTD_TELEMETRY__{})",
            key.to_ascii_uppercase()
        ),
        None => rule,
    };
    invalid(format!("telemetry.{key}"), rule)
}

/// A string, also written as a bare number (`0.25` as well as `"0.25"`).
fn string_or_number<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        S(String),
        F(f64),
        I(i64),
    }
    Ok(match Raw::deserialize(d)? {
        Raw::S(s) => s,
        Raw::F(f) => f.to_string(),
        Raw::I(i) => i.to_string(),
    })
}

impl TelemetryConfig {
    /// The sampler ratio; valid after [`Config::validate`].
    pub fn sampler_ratio(&self) -> f64 {
        self.traces_sampler_arg.trim().parse().unwrap_or(1.0)
    }

    /// The resource attributes as pairs; valid after [`Config::validate`].
    pub fn resource_pairs(&self) -> Vec<(String, String)> {
        self.resource_attributes
            .split(',')
            .filter(|p| !p.trim().is_empty())
            .filter_map(|p| p.split_once('='))
            .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
            .collect()
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let e = self.otlp_endpoint.trim();
        if !(e.is_empty() || e.starts_with("http://") || e.starts_with("https://")) {
            return Err(telemetry_invalid(
                "otlp_endpoint",
                format!("must be an http:// or https:// URL (got {e:?})"),
            ));
        }
        if self.service_name.trim().is_empty() {
            return Err(telemetry_invalid("service_name", "must not be empty"));
        }
        for pair in self.resource_attributes.split(',') {
            if !pair.trim().is_empty()
                && pair
                    .split_once('=')
                    .is_none_or(|(k, _)| k.trim().is_empty())
            {
                return Err(telemetry_invalid(
                    "resource_attributes",
                    format!("must be key=value pairs separated by commas (got {pair:?})"),
                ));
            }
        }
        if !TRACES_SAMPLERS.contains(&self.traces_sampler.as_str()) {
            return Err(telemetry_invalid(
                "traces_sampler",
                format!(
                    "must be one of {} (got {:?})",
                    TRACES_SAMPLERS.join(", "),
                    self.traces_sampler
                ),
            ));
        }
        let arg = self.traces_sampler_arg.trim();
        if !arg.is_empty() && !arg.parse::<f64>().is_ok_and(|r| (0.0..=1.0).contains(&r)) {
            return Err(telemetry_invalid(
                "traces_sampler_arg",
                format!("must be a ratio between 0 and 1 (got {arg:?})"),
            ));
        }
        if !self.metrics_listen.is_empty() && self.metrics_listen.parse::<SocketAddr>().is_err() {
            return Err(invalid(
                "telemetry.metrics_listen",
                format!(
                    "must be an IP:port address, or empty for no endpoint (got {:?})",
                    self.metrics_listen
                ),
            ));
        }
        Ok(())
    }
}
