//! `[limits]` and `[tenants.NAME]`: admission limits.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{
    auth::{is_tenant_name, MAX_TENANT_BYTES},
    error::{invalid, ConfigError},
};

/// Default `[limits] max_background_agents`.
pub const DEFAULT_MAX_BACKGROUND_AGENTS: u32 = 5;
/// Default `[limits] default_concurrency`.
pub const DEFAULT_CONCURRENCY: u32 = 5;
/// Default `[limits] max_concurrent_per_parent`.
pub const DEFAULT_MAX_CONCURRENT_PER_PARENT: u32 = 3;
/// Default `[limits] max_depth`.
pub const DEFAULT_MAX_DEPTH: u32 = 3;
/// Default `[limits] max_prompt_bytes` (1 MiB).
pub const DEFAULT_MAX_PROMPT_BYTES: usize = 1 << 20;

/// `[tenants.NAME]` section.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct TenantLimits {
    /// Live background agents of the tenant; beyond it its Spawns are
    /// refused (TENANT_LIMIT_REACHED). 0 (default) = only the global cap.
    pub max_background_agents: u32,
    /// Spawns per second the tenant may make on average (a token bucket);
    /// beyond it RATE_LIMITED with a RetryInfo. 0 (default) = unlimited.
    pub spawn_rate: f64,
    /// Spawns the tenant may make at once before the rate applies (the
    /// bucket's size). 0 (default) = one second's worth of `spawn_rate`,
    /// at least 1.
    pub spawn_burst: u32,
}

impl TenantLimits {
    /// Checks the entry of tenant `name`; errors name the key.
    pub fn validate(&self, name: &str) -> Result<(), ConfigError> {
        if !is_tenant_name(name) {
            return Err(invalid(
                format!("tenants.{name}"),
                format!(
                    "tenant names are 1 to {MAX_TENANT_BYTES} ASCII letters, digits, '-', '_' or '.'"
                ),
            ));
        }
        if !(self.spawn_rate.is_finite() && self.spawn_rate >= 0.0) {
            return Err(invalid(
                format!("tenants.{name}.spawn_rate"),
                format!("must be a number ≥ 0 (got {})", self.spawn_rate),
            ));
        }
        Ok(())
    }

    /// The token bucket's size.
    pub fn burst(&self) -> f64 {
        if self.spawn_burst > 0 {
            f64::from(self.spawn_burst)
        } else {
            self.spawn_rate.ceil().max(1.0)
        }
    }
}

/// Default `[limits] max_watchers_per_tenant`.
pub const DEFAULT_MAX_WATCHERS_PER_TENANT: u32 = 100;

/// `[limits]` section: every admission limit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Live background agents (queued + running + awaiting approval) across
    /// the server; beyond it Spawn is rejected. Default 5, minimum 1.
    pub max_background_agents: u32,
    /// Running agents per bucket when neither the model nor its provider has
    /// an entry. Default 5; 0 = unlimited.
    pub default_concurrency: u32,
    /// Running agents per provider, shared by all its models; 0 = unlimited.
    pub provider_concurrency: BTreeMap<String, u32>,
    /// Running agents per "provider/model"; overrides the provider entry;
    /// 0 = unlimited.
    pub model_concurrency: BTreeMap<String, u32>,
    /// Running background children of one parent (agent or lead). Default 3;
    /// 0 = unlimited.
    pub max_concurrent_per_parent: u32,
    /// Deepest allowed agent (roots are depth 1). Default 3.
    pub max_depth: u32,
    /// Live agents in one tree, the root included. Default 0 = unlimited.
    pub max_live_descendants_per_root: u32,
    /// Largest accepted prompt in bytes. Default 1 MiB.
    pub max_prompt_bytes: usize,
    /// Open WatchAgents streams of one tenant (an admin's count in its
    /// own); one more is refused with WATCH_LIMIT_REACHED. Default 100;
    /// 0 = unlimited.
    pub max_watchers_per_tenant: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_background_agents: DEFAULT_MAX_BACKGROUND_AGENTS,
            default_concurrency: DEFAULT_CONCURRENCY,
            provider_concurrency: BTreeMap::new(),
            model_concurrency: BTreeMap::new(),
            max_concurrent_per_parent: DEFAULT_MAX_CONCURRENT_PER_PARENT,
            max_depth: DEFAULT_MAX_DEPTH,
            max_live_descendants_per_root: 0,
            max_prompt_bytes: DEFAULT_MAX_PROMPT_BYTES,
            max_watchers_per_tenant: DEFAULT_MAX_WATCHERS_PER_TENANT,
        }
    }
}

impl Limits {
    /// Checks every rule; errors name the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.max_background_agents < 1 {
            return Err(invalid(
                "limits.max_background_agents",
                format!("must be ≥ 1 (got {})", self.max_background_agents),
            ));
        }
        if self.max_depth < 1 {
            return Err(invalid(
                "limits.max_depth",
                format!("must be ≥ 1 (got {})", self.max_depth),
            ));
        }
        if self.max_prompt_bytes < 1 {
            return Err(invalid("limits.max_prompt_bytes", "must be ≥ 1 (got 0)"));
        }
        for provider in self.provider_concurrency.keys() {
            if provider.is_empty() || provider.contains('/') {
                return Err(invalid(
                    format!("limits.provider_concurrency.{provider}"),
                    "must name a provider (no '/')",
                ));
            }
        }
        for model in self.model_concurrency.keys() {
            if ModelRef::parse(model).is_none() {
                return Err(invalid(
                    format!("limits.model_concurrency.\"{model}\""),
                    "must name a model as \"provider/model\"",
                ));
            }
        }
        Ok(())
    }
}

/// A model named as "provider/model".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelRef<'a> {
    /// The part before the first `/`.
    pub provider: &'a str,
    /// The part after the first `/`.
    pub name: &'a str,
}

impl<'a> ModelRef<'a> {
    /// Parses "provider/model"; both parts must be non-empty and free of
    /// whitespace.
    pub fn parse(s: &'a str) -> Option<Self> {
        let (provider, name) = s.split_once('/')?;
        let ok = |p: &str| !p.is_empty() && !p.chars().any(char::is_whitespace);
        (ok(provider) && ok(name)).then_some(Self { provider, name })
    }
}
