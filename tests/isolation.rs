//! Issue 15 §7, the isolation matrix, against the built binary over
//! loopback gRPC: every RPC × every kind of caller (tenant B's viewer,
//! frontend, approver and worker; an admin of another tenant; no
//! credential; an unknown key) × every kind of target (the caller's own
//! agent, tenant A's, an id that never existed).
//!
//! Each answer's code follows from the contract's role table alone; another
//! tenant's agent is answered exactly like one that never existed (code,
//! message, details, listings, watch events); nothing of tenant A's appears
//! in anything B is sent. Canaries in A's prompts, results, labels,
//! descriptions and steer messages are then looked for in the server's
//! metrics, in every log line it wrote (our code at trace level) and in
//! every span it exported: none may hold them, whoever asked.

mod common;

use std::{collections::BTreeMap, net::SocketAddr, time::Duration};

use common::{
    auth::{key, open_worker_as, with_key, Key},
    bg,
    child::ChildServer,
    error_info, fg,
    otlp::Receiver,
};
use subagentd::pb::{self, agent_service_client::AgentServiceClient, connect_request, run_event};
use tonic::{transport::Channel, Code};

/// In A's prompts, results, labels, descriptions and steer messages: in
/// no answer to another tenant, and in no metric, log line or span at all.
const SECRET: &str = "secret-canary-91c2";
/// In A's lead ids, idempotency keys and tool names: in no answer to
/// another tenant.
const NAME: &str = "name-canary-5d0e";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Caller {
    Viewer,
    Frontend,
    Approver,
    Worker,
    /// An admin whose own tenant is neither A nor B.
    Admin,
    /// No credential.
    Anonymous,
    /// A well-formed key no entry knows.
    UnknownKey,
}

const CALLERS: [Caller; 7] = [
    Caller::Viewer,
    Caller::Frontend,
    Caller::Approver,
    Caller::Worker,
    Caller::Admin,
    Caller::Anonymous,
    Caller::UnknownKey,
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Target {
    /// An agent of the caller's own tenant.
    Own,
    /// One of tenant A's agents.
    Other,
    /// An id that never existed (and a lead id nobody used).
    Unknown,
}

const TARGETS: [Target; 3] = [Target::Own, Target::Other, Target::Unknown];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rpc {
    /// Status by id.
    Status,
    /// Status listing by lead id.
    List,
    Await,
    /// Spawn under the target as parent.
    Spawn,
    /// Cancel by id.
    Cancel,
    /// Cancel by lead id.
    CancelLead,
    Steer,
    Approve,
    /// WatchAgents by ids, with a snapshot.
    Watch,
    /// WatchAgents unfiltered, with a snapshot.
    WatchAll,
    /// WorkerService.Connect, then a report on the target as if it were
    /// the worker's run.
    Connect,
}

const RPCS: [Rpc; 11] = [
    Rpc::Status,
    Rpc::List,
    Rpc::Await,
    Rpc::Spawn,
    Rpc::Cancel,
    Rpc::CancelLead,
    Rpc::Steer,
    Rpc::Approve,
    Rpc::Watch,
    Rpc::WatchAll,
    Rpc::Connect,
];

/// The contract's role table (issue 15 §2), written out independently of
/// the server's.
fn may_call(caller: Caller, rpc: Rpc) -> bool {
    use Caller::*;
    match rpc {
        Rpc::Status | Rpc::List | Rpc::Await | Rpc::Watch | Rpc::WatchAll => {
            matches!(caller, Viewer | Frontend | Approver | Admin)
        }
        Rpc::Spawn | Rpc::Cancel | Rpc::CancelLead | Rpc::Steer => {
            matches!(caller, Frontend | Admin)
        }
        Rpc::Approve => matches!(caller, Approver | Admin),
        Rpc::Connect => caller == Worker,
    }
}

/// Whether the caller may see and act on the target: its own tenant's
/// agents, and for an admin every tenant's, except as a parent (an admin's
/// Spawns land in its own tenant, and a parent must be in the child's) and
/// by lead id (a lead id names a lead of the caller's own tenant:
/// docs/security.md "Tenants").
fn sees(caller: Caller, rpc: Rpc, target: Target) -> bool {
    match target {
        Target::Own => true,
        Target::Other => caller == Caller::Admin && !matches!(rpc, Rpc::Spawn | Rpc::CancelLead),
        Target::Unknown => false,
    }
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Tenant {
    A,
    B,
    Ops,
}

/// An agent made for one check: its id and lead id.
struct Made {
    id: String,
    lead: String,
}

/// What a call answered, with the target's id and lead id replaced, so
/// that the answers for two targets compare.
#[derive(Debug, PartialEq, Eq)]
struct Answer {
    code: Code,
    shape: String,
    /// Whether the target itself appeared in the answer (a listing, an
    /// Await, a watch's events).
    saw_target: bool,
}

struct World {
    server: ChildServer,
    addr: SocketAddr,
    client: AgentServiceClient<Channel>,
    keys: BTreeMap<&'static str, Key>,
    unknown_key: String,
    made: usize,
}

const CONFIG: &str = r#"
[limits]
max_background_agents = 10000
default_concurrency = 0

[agents.simulated]
runner = "simulated"

[agents.coder]
runner = "worker"

[auth]
mode = "required"
"#;

impl World {
    async fn start(otlp: &Receiver) -> Self {
        let keys: BTreeMap<&'static str, Key> = [
            ("afront", key("afront", "team-a", &["frontend"], None)),
            ("bview", key("bview", "team-b", &["viewer"], None)),
            ("bfront", key("bfront", "team-b", &["frontend"], None)),
            ("bappr", key("bappr", "team-b", &["approver"], None)),
            ("bwork", key("bwork", "team-b", &["worker"], None)),
            ("ops", key("ops", "ops", &["admin"], None)),
        ]
        .into();
        let mut toml = CONFIG.to_owned();
        for (id, k) in &keys {
            toml.push_str(&format!("\n[auth.keys.{id}]\n{}", k.entry));
        }
        let endpoint = format!("http://{}", otlp.addr);
        let server = ChildServer::start(
            &toml,
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
                ("OTEL_BSP_SCHEDULE_DELAY", "100"),
                ("RUST_LOG", "subagentd=trace,info"),
            ],
        )
        .await;
        let addr = server.addr.parse().unwrap();
        let client = server.client().await;
        Self {
            server,
            addr,
            client,
            keys,
            unknown_key: subagentd::auth::keys::generate("nobody").unwrap(),
            made: 0,
        }
    }

    fn key_of(&self, caller: Caller) -> Option<&str> {
        let id = match caller {
            Caller::Viewer => "bview",
            Caller::Frontend => "bfront",
            Caller::Approver => "bappr",
            Caller::Worker => "bwork",
            Caller::Admin => "ops",
            Caller::Anonymous => return None,
            Caller::UnknownKey => return Some(&self.unknown_key),
        };
        Some(&self.keys[id].key)
    }

    /// A request carrying the caller's credential, if it has one.
    fn request<T>(&self, caller: Caller, message: T) -> tonic::Request<T> {
        match self.key_of(caller) {
            Some(key) => with_key(message, key),
            None => tonic::Request::new(message),
        }
    }

    /// The key that makes agents in `tenant`.
    fn maker(&self, tenant: Tenant) -> &str {
        let id = match tenant {
            Tenant::A => "afront",
            Tenant::B => "bfront",
            Tenant::Ops => "ops",
        };
        &self.keys[id].key
    }

    /// A new running agent of `tenant` under a new lead; A's carries the
    /// canaries everywhere a caller can put them, and a steer message.
    async fn make(&mut self, tenant: Tenant) -> Made {
        self.made += 1;
        let n = self.made;
        let req = match tenant {
            Tenant::A => pb::SpawnRequest {
                lead_id: format!("{NAME}-lead-{n}"),
                idempotency_key: format!("{NAME}-key-{n}"),
                labels: [("owner".to_owned(), format!("{SECRET}-label"))].into(),
                description: format!("{SECRET}-description"),
                ..bg(
                    "openai/gpt-4o",
                    &format!("output {SECRET}-output\ntool {NAME}-tool\nsleep 60000"),
                )
            },
            Tenant::B | Tenant::Ops => pb::SpawnRequest {
                lead_id: format!("lead-{n}"),
                ..bg("openai/gpt-4o", "sleep 60000")
            },
        };
        let key = self.maker(tenant).to_owned();
        let agent = self
            .client
            .spawn(with_key(req, &key))
            .await
            .expect("spawn")
            .into_inner()
            .agent
            .unwrap();
        if tenant == Tenant::A {
            self.client
                .steer(with_key(
                    pb::SteerRequest {
                        id: agent.id.clone(),
                        message: format!("{SECRET}-steer"),
                    },
                    &key,
                ))
                .await
                .expect("A steers its own agent");
        }
        Made {
            id: agent.id,
            lead: agent.lead_id,
        }
    }

    /// The tenant whose agents the caller calls its own.
    fn own_tenant(caller: Caller) -> Tenant {
        if caller == Caller::Admin {
            Tenant::Ops
        } else {
            Tenant::B
        }
    }

    async fn target(&mut self, caller: Caller, target: Target) -> Made {
        match target {
            Target::Own => self.make(Self::own_tenant(caller)).await,
            Target::Other => self.make(Tenant::A).await,
            Target::Unknown => Made {
                id: uuid::Uuid::now_v7().to_string(),
                lead: format!("lead-never-{}", uuid::Uuid::now_v7()),
            },
        }
    }

    /// Whether A's agent `id` is still running, untouched, as A sees it.
    async fn a_still_running(&mut self, id: &str) -> bool {
        let key = self.maker(Tenant::A).to_owned();
        let agents = self
            .client
            .status(with_key(
                pb::StatusRequest {
                    ids: vec![id.to_owned()],
                    ..Default::default()
                },
                &key,
            ))
            .await
            .unwrap()
            .into_inner()
            .agents;
        agents[0].status == pb::AgentStatus::Running as i32
            && !agents[0].result.contains("injected")
    }

    /// Calls `rpc` as `caller` on `t` and returns what it answered. Every
    /// message the caller receives goes through `check` first.
    async fn call(&mut self, rpc: Rpc, caller: Caller, t: &Made, check: &dyn Fn(&str)) -> Answer {
        let id = t.id.clone();
        let mut c = self.client.clone();
        let shaped = |text: String| text.replace(&t.id, "ID").replace(&t.lead, "LEAD");
        let refused = |status: tonic::Status| {
            let text = format!("{status:?}");
            check(&text);
            let (reason, meta) = error_info(&status);
            let meta: BTreeMap<_, _> = meta.into_iter().collect();
            Answer {
                code: status.code(),
                shape: shaped(format!("{} {reason} {meta:?}", status.message())),
                saw_target: false,
            }
        };
        macro_rules! unary {
            ($method:ident, $req:expr, |$answer:ident| $saw:expr) => {
                match c.$method(self.request(caller, $req)).await {
                    Ok(response) => {
                        let $answer = response.into_inner();
                        let text = format!("{:?}", $answer);
                        check(&text);
                        Answer {
                            code: Code::Ok,
                            saw_target: $saw,
                            shape: shaped(text),
                        }
                    }
                    Err(status) => refused(status),
                }
            };
        }
        let has = |agents: &[pb::Agent]| agents.iter().any(|a| a.id == id);
        match rpc {
            Rpc::Status => unary!(
                status,
                pb::StatusRequest {
                    ids: vec![id.clone()],
                    ..Default::default()
                },
                |a| has(&a.agents)
            ),
            Rpc::List => unary!(
                status,
                pb::StatusRequest {
                    lead_id: t.lead.clone(),
                    ..Default::default()
                },
                |a| has(&a.agents)
            ),
            Rpc::Await => unary!(
                r#await,
                pb::AwaitRequest {
                    ids: vec![id.clone()],
                    timeout: Some(prost_types::Duration {
                        seconds: 0,
                        nanos: 1_000_000,
                    }),
                    ..Default::default()
                },
                |a| has(&a.agents)
            ),
            Rpc::Spawn => unary!(
                spawn,
                pb::SpawnRequest {
                    parent_id: id.clone(),
                    ..bg("openai/gpt-4o", "sleep 60000")
                },
                |a| a.agent.is_some_and(|child| child.parent_id == id)
            ),
            Rpc::Cancel => unary!(
                cancel,
                pb::CancelRequest {
                    id: id.clone(),
                    ..Default::default()
                },
                |a| has(&a.agents)
            ),
            Rpc::CancelLead => unary!(
                cancel,
                pb::CancelRequest {
                    lead_id: t.lead.clone(),
                    ..Default::default()
                },
                |a| has(&a.agents)
            ),
            Rpc::Steer => unary!(
                steer,
                pb::SteerRequest {
                    id: id.clone(),
                    message: "go on".into(),
                },
                |_a| true
            ),
            Rpc::Approve => unary!(
                approve,
                pb::ApproveRequest {
                    id: id.clone(),
                    approval_id: uuid::Uuid::now_v7().to_string(),
                    decision: pb::ApprovalDecision::Approve as i32,
                    ..Default::default()
                },
                |_a| true
            ),
            Rpc::Watch | Rpc::WatchAll => {
                // A sentinel of the caller's tenant (made by that tenant's
                // frontend or admin) bounds the watch without a clock: its
                // cancel is the last event read.
                let sentinel = self.make(Self::own_tenant(caller)).await;
                let ids = match rpc {
                    Rpc::Watch => vec![id.clone(), sentinel.id.clone()],
                    _ => Vec::new(),
                };
                let watch = c
                    .watch_agents(self.request(
                        caller,
                        pb::WatchAgentsRequest {
                            ids,
                            include_snapshot: true,
                            ..Default::default()
                        },
                    ))
                    .await;
                let mut stream = match watch {
                    Ok(stream) => stream.into_inner(),
                    Err(status) => return refused(status),
                };
                let maker = self.maker(Self::own_tenant(caller)).to_owned();
                c.cancel(with_key(
                    pb::CancelRequest {
                        id: sentinel.id.clone(),
                        ..Default::default()
                    },
                    &maker,
                ))
                .await
                .unwrap();
                let mut about_target = Vec::new();
                loop {
                    let event = tokio::time::timeout(Duration::from_secs(20), stream.message())
                        .await
                        .expect("the sentinel's cancel arrives")
                        .expect("the watch stays healthy")
                        .expect("the watch stays open");
                    check(&format!("{event:?}"));
                    let agent = event.agent.clone().unwrap_or_default();
                    if agent.id == id {
                        about_target.push(event.kind);
                    }
                    if agent.id == sentinel.id && event.kind == pb::AgentEventKind::Cancelled as i32
                    {
                        break;
                    }
                }
                Answer {
                    code: Code::Ok,
                    saw_target: !about_target.is_empty(),
                    shape: format!("{about_target:?}"),
                }
            }
            Rpc::Connect => self.connect_and_report(caller, t, check).await,
        }
    }

    /// A worker session as `caller`; once welcomed, it reports a result for
    /// the target as if it ran it, which the server must ignore (the target
    /// is no run of this worker). The server's log line saying so is the
    /// barrier after which the target is checked.
    async fn connect_and_report(
        &mut self,
        caller: Caller,
        t: &Made,
        check: &dyn Fn(&str),
    ) -> Answer {
        let hello = pb::WorkerHello {
            name: "matrix".into(),
            agents: vec!["coder".into()],
            capacity: 1,
            ..Default::default()
        };
        let opened = open_worker_as(self.addr, self.key_of(caller), hello).await;
        let (tx, stream) = match opened {
            Ok(session) => session,
            Err(status) => {
                check(&format!("{status:?}"));
                let (reason, meta) = error_info(&status);
                let meta: BTreeMap<_, _> = meta.into_iter().collect();
                return Answer {
                    code: status.code(),
                    shape: format!("{} {reason} {meta:?}", status.message()),
                    saw_target: false,
                };
            }
        };
        tx.send(pb::ConnectRequest {
            message: Some(connect_request::Message::Event(pb::RunEvent {
                agent_id: t.id.clone(),
                attempt: 1,
                seq: 1,
                event: Some(run_event::Event::Done(pb::RunDone {
                    result: "injected".into(),
                    ..Default::default()
                })),
            })),
        })
        .unwrap();
        let id = t.id.clone();
        self.server
            .log_line(|v| {
                v["message"] == "worker report ignored: not a live run of this worker"
                    && v["agent"] == id.as_str()
            })
            .await;
        drop((tx, stream));
        Answer {
            code: Code::Ok,
            saw_target: false,
            shape: "report ignored".into(),
        }
    }
}

/// What a successful call on a target the caller sees answers.
fn success_code(rpc: Rpc) -> Code {
    match rpc {
        // The agent awaits no approval: past the policy and the lookup,
        // the state refuses it.
        Rpc::Approve => Code::FailedPrecondition,
        _ => Code::Ok,
    }
}

#[tokio::test]
async fn every_rpc_caller_and_target_keeps_tenants_apart() {
    let mut otlp = Receiver::start().await;
    let mut world = World::start(&otlp).await;
    // A's finished agent: its result is a canary too.
    let key = world.maker(Tenant::A).to_owned();
    let done = world
        .client
        .spawn(with_key(
            fg("openai/gpt-4o", &format!("output {SECRET}-result")),
            &key,
        ))
        .await
        .unwrap()
        .into_inner()
        .agent
        .unwrap();
    assert!(done.result.contains(SECRET), "{done:?}");

    let mut checked = 0;
    for rpc in RPCS {
        for caller in CALLERS {
            let mut answers = BTreeMap::new();
            for target in TARGETS {
                let t = world.target(caller, target).await;
                // Only an admin may be shown tenant A's data.
                let clean = |text: &str| {
                    if caller != Caller::Admin {
                        for canary in [SECRET, NAME, "team-a"] {
                            assert!(
                                !text.contains(canary),
                                "{rpc:?} by {caller:?} on {target:?}: sent {canary}: {text}"
                            );
                        }
                    }
                };
                let answer = world.call(rpc, caller, &t, &clean).await;
                let what = format!("{rpc:?} by {caller:?} on {target:?}: {answer:?}");
                match caller {
                    Caller::Anonymous | Caller::UnknownKey => {
                        assert_eq!(answer.code, Code::Unauthenticated, "{what}")
                    }
                    _ if !may_call(caller, rpc) => {
                        assert_eq!(answer.code, Code::PermissionDenied, "{what}")
                    }
                    _ if rpc == Rpc::Connect => {
                        assert_eq!(answer.code, Code::Ok, "{what}")
                    }
                    _ if sees(caller, rpc, target) => {
                        assert_eq!(answer.code, success_code(rpc), "{what}");
                        if matches!(rpc, Rpc::Status | Rpc::List | Rpc::Await | Rpc::Cancel)
                            || matches!(rpc, Rpc::CancelLead | Rpc::Watch | Rpc::Spawn)
                        {
                            assert!(answer.saw_target, "{what}");
                        }
                    }
                    _ => {
                        // Hidden or unknown: compared below.
                        assert!(!answer.saw_target, "{what}");
                    }
                }
                if target == Target::Other && caller != Caller::Admin {
                    // Whatever B did, A's agent is as A left it.
                    assert!(
                        world.a_still_running(&t.id).await,
                        "{what}: touched A's agent"
                    );
                }
                answers.insert(format!("{target:?}"), answer);
                checked += 1;
            }
            // Another tenant's agent is answered like one that never was.
            if !sees(caller, rpc, Target::Other) {
                assert_eq!(
                    answers["Other"], answers["Unknown"],
                    "{rpc:?} by {caller:?}: A's agent is told apart from an unknown one"
                );
            }
            let by_id = !matches!(
                rpc,
                Rpc::List | Rpc::CancelLead | Rpc::Watch | Rpc::WatchAll
            ) && rpc != Rpc::Connect;
            if by_id && may_call(caller, rpc) {
                assert_eq!(
                    answers["Unknown"].code,
                    Code::NotFound,
                    "{rpc:?} by {caller:?}"
                );
            }
        }
    }
    assert_eq!(checked, RPCS.len() * CALLERS.len() * TARGETS.len());

    // Nothing of A's secrets in the metrics, the spans or the logs, and
    // no agent id in the metrics.
    let metrics = reqwest::get(format!("http://{}/metrics", world.server.metrics))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(metrics.contains("tenant=\"team-a\""), "{metrics}");
    assert!(
        !metrics.contains(SECRET),
        "metrics hold a secret: {metrics}"
    );
    assert!(
        !metrics.contains(NAME),
        "metrics hold a lead or key: {metrics}"
    );
    assert!(!metrics.contains(&done.id), "metrics hold an agent id");
    otlp.wait_for("the finished agent's span", |spans| {
        spans
            .iter()
            .any(|s| format!("{s:?}").contains(&done.id))
            .then_some(())
    })
    .await;
    let World { server, keys, .. } = world;
    let (exit, logs) = server.stop_with_logs().await;
    assert!(exit.success(), "{exit:?}");
    let spans = otlp.spans();
    assert!(!spans.is_empty());
    for span in &spans {
        let text = format!("{span:?}");
        assert!(!text.contains(SECRET), "a span holds a secret: {text}");
    }
    assert!(logs.len() > 100, "only {} log lines", logs.len());
    for line in &logs {
        assert!(!line.contains(SECRET), "a log line holds a secret: {line}");
        for k in keys.values() {
            assert!(!line.contains(&k.key), "a log line holds a key: {line}");
        }
    }
}
