//! Entry points of the fuzz targets in `fuzz/` (cargo-fuzz, docs/security.md
//! "Fuzzing"). Each takes arbitrary bytes through what untrusted input
//! meets on the server before the scheduler: protobuf decoding, conversion
//! and validation of every RPC's request and of the worker protocol's
//! messages, and credential parsing. None of them may panic, whatever the
//! bytes; `tests/fuzz_requests.rs` also runs them on random input in
//! `cargo test`.

use std::sync::{Arc, OnceLock};

use prost::Message;

use crate::{
    auth::{self, jwt, keys, AuthConfig, AuthMode, Authenticator, Credential, KeyConfig, Role},
    pb, wire,
};

/// Tenants a listing or watch may be scoped to: one tenant (a caller's
/// own) or every tenant (an admin's).
fn scope(selector: u8) -> Option<Arc<str>> {
    (selector & 0x80 == 0).then(|| Arc::from("fuzz"))
}

/// The first byte picks an AgentService request type (and, for listings
/// and watches, the caller's scope); the rest is its wire encoding, which
/// is decoded and, when it decodes, converted and validated.
pub fn agent_request(data: &[u8]) {
    let Some((&selector, bytes)) = data.split_first() else {
        return;
    };
    match selector % 7 {
        0 => drop(pb::SpawnRequest::decode(bytes).map(wire::parse_spawn)),
        1 => drop(pb::StatusRequest::decode(bytes).map(|r| wire::parse_status(r, scope(selector)))),
        2 => drop(pb::AwaitRequest::decode(bytes).map(wire::parse_await)),
        3 => drop(pb::CancelRequest::decode(bytes).map(wire::parse_cancel)),
        4 => drop(pb::SteerRequest::decode(bytes).map(wire::parse_steer)),
        5 => drop(pb::ApproveRequest::decode(bytes).map(wire::parse_approve)),
        _ => drop(
            pb::WatchAgentsRequest::decode(bytes).map(|r| wire::parse_watch(r, scope(selector))),
        ),
    }
}

/// The agent types a fuzzed worker hello is checked against.
const WORKER_TYPES: &[&str] = &["coder", "writer"];

/// A worker session's message (`ConnectRequest`): a first message is
/// parsed as the hello, any other as a run event; the first byte says
/// which. An `Agent` record as a standby or a store reads it is tried too.
pub fn worker_message(data: &[u8]) {
    let Some((&selector, bytes)) = data.split_first() else {
        return;
    };
    match selector % 3 {
        0 => {
            let types: Vec<String> = WORKER_TYPES.iter().map(|t| (*t).to_owned()).collect();
            if let Ok(req) = pb::ConnectRequest::decode(bytes) {
                let _ = wire::parse_hello(req, &types);
            }
        }
        1 => {
            if let Ok(pb::ConnectRequest {
                message: Some(pb::connect_request::Message::Event(event)),
            }) = pb::ConnectRequest::decode(bytes)
            {
                let _ = wire::worker_event_from_pb(event);
            }
        }
        _ => {
            if let Ok(agent) = pb::Agent::decode(bytes) {
                let _ = wire::agent_from_pb(&agent);
            }
        }
    }
}

/// The one API key the credential target's authenticator accepts. Fixed,
/// so that a fuzzer could in principle find it (it must not be able to
/// find anything else that passes).
const FUZZ_KEY: &str = "sa_fuzz_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";

/// A JWKS with one EC P-256 public key (whose private half nobody kept),
/// so that tokens reach signature verification's parsing.
const FUZZ_JWKS: &str = r#"{"keys":[{"kty":"EC","crv":"P-256","kid":"fuzz","use":"sig","alg":"ES256","x":"TPfJCatvX3da_5ycZPDoqoj8EGnh7pFdr2O92Lvitw4","y":"afhYlQ5xB5RfQWI02c26wuuNJ2uRgTrMTt88yLfN5AU"}]}"#;

fn authenticator() -> &'static Authenticator {
    static AUTH: OnceLock<Authenticator> = OnceLock::new();
    AUTH.get_or_init(|| {
        let config = AuthConfig {
            mode: AuthMode::Required,
            keys: [(
                "fuzz".to_owned(),
                KeyConfig {
                    sha256: keys::digest_hex(&keys::digest(FUZZ_KEY)),
                    tenant: "fuzz".to_owned(),
                    roles: vec![Role::Frontend],
                    agent_types: None,
                },
            )]
            .into(),
            certs: vec![auth::CertConfig {
                san: "spiffe://fuzz/worker".to_owned(),
                tenant: "fuzz".to_owned(),
                roles: vec![Role::Worker],
                agent_types: None,
            }],
            ..AuthConfig::default()
        };
        let verifier = jwt::JwtVerifier::new(jwt::JwtConfig {
            issuer: "https://issuer.fuzz".to_owned(),
            audience: "subagentd".to_owned(),
            jwks_file: "/nonexistent".to_owned(),
            ..jwt::JwtConfig::default()
        });
        verifier
            .install(FUZZ_JWKS.as_bytes())
            .expect("the fuzz JWKS is valid");
        Authenticator::with_dir_keys(
            &config,
            &Default::default(),
            Some(Arc::new(verifier)),
            Arc::default(),
        )
    })
}

/// An `authorization` header (and, after a NUL byte, a `subagentd-tenant`
/// header) checked for a method the first byte picks. Only the one key may
/// be accepted.
pub fn credential(data: &[u8]) {
    const PATHS: &[&str] = &[
        "/subagents.v1.AgentService/Spawn",
        "/subagents.v1.AgentService/Status",
        "/subagents.v1.WorkerService/Connect",
        "/subagents.v1.NoSuchService/Call",
    ];
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let (authorization, tenant) = match rest.iter().position(|&b| b == 0) {
        Some(nul) => (&rest[..nul], Some(&rest[nul + 1..])),
        None => (rest, None),
    };
    let path = PATHS[usize::from(selector) % PATHS.len()];
    let credential = Credential {
        authorization: Some(authorization),
        peer_sans: None,
        tenant,
    };
    if let Ok(principal) = authenticator().check(credential, path) {
        let header = String::from_utf8_lossy(authorization);
        assert!(
            header.contains(FUZZ_KEY),
            "accepted a credential that is not the key: {header:?}"
        );
        assert_eq!(&*principal.tenant, "fuzz");
    }
}
