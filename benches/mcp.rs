//! MCP latency (issue 33): what a host waits for, measured through rmcp's
//! client against `subagentd mcp` as a child process (stdio), in front of
//! an in-process server with the simulated runner:
//!
//! - `tools/list` round trips;
//! - background `agent_spawn` round trips (the Spawn, its durable answer,
//!   the tool's structured result);
//! - `agent_await` wake-up: an inbox await is waiting; the time from
//!   sending the Steer that lets its agent settle to the await's answer
//!   (the Steer's own round trip and the run's last step included).
//!
//! `cargo bench --bench mcp` (release); `-- --samples N` to change the
//! sample count. Prints p50 and p99 of each, in microseconds.

use std::time::{Duration, Instant};

use rmcp::{
    model::{CallToolRequestParams, JsonObject},
    service::RunningService,
    transport::{ConfigureCommandExt, TokioChildProcess},
    RoleClient, ServiceExt,
};
use serde_json::json;
use subagentd::{
    config::{Config, ConfigSource, StoreBackend},
    pb::{self, agent_service_client::AgentServiceClient},
};

type Client = RunningService<RoleClient, ()>;

fn args(value: serde_json::Value) -> JsonObject {
    value.as_object().unwrap().clone()
}

fn spawn_args(prompt: &str) -> JsonObject {
    args(json!({
        "prompt": prompt, "agent": "simulated", "description": null, "model": "acme/m",
        "wait_seconds": null, "timeout_minutes": null, "continue_from": null, "fork": null,
    }))
}

async fn spawn(client: &Client, prompt: &str) -> String {
    let result = client
        .call_tool(CallToolRequestParams::new("agent_spawn").with_arguments(spawn_args(prompt)))
        .await
        .expect("agent_spawn");
    result.structured_content.expect("structured")["id"]
        .as_str()
        .expect("id")
        .to_owned()
}

fn report(name: &str, mut samples: Vec<Duration>) {
    samples.sort_unstable();
    let at = |q: f64| samples[((samples.len() as f64 - 1.0) * q).round() as usize];
    println!(
        "{name:<28} n={:<5} p50={:>8.0} µs  p99={:>8.0} µs",
        samples.len(),
        at(0.50).as_secs_f64() * 1e6,
        at(0.99).as_secs_f64() * 1e6
    );
}

#[tokio::main]
async fn main() {
    let samples: usize = std::env::args()
        .skip_while(|a| a != "--samples")
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(300);
    let mut config: Config = ConfigSource::from_toml_str(
        "[limits]\nmax_background_agents = 100000\ndefault_concurrency = 0\n\
         [runs]\nfinished_retention = \"1h\"\n",
    )
    .expect("bench config");
    config.server.listen = "127.0.0.1:0".into();
    config.telemetry.metrics_listen = String::new();
    config.http.listen = String::new();
    config.server.shutdown_grace = Duration::ZERO;
    config.store.backend = StoreBackend::Memory;
    let server = subagentd::server::start(config, ConfigSource::default())
        .await
        .expect("server starts");
    let addr = server.addr().to_string();
    let command = tokio::process::Command::new(env!("CARGO_BIN_EXE_subagentd")).configure(|c| {
        c.args(["mcp", "--addr", &addr, "--lead-id", "bench"])
            .env_remove("SUBAGENTD_AGENT_ID")
            .env_remove("SUBAGENTD_TOKEN");
    });
    let client: Client =
        ().serve(TokioChildProcess::new(command).expect("spawn"))
            .await
            .expect("init");
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .expect("address")
        .connect()
        .await
        .expect("grpc");
    let mut grpc = AgentServiceClient::new(channel);

    // Warm up both paths.
    for _ in 0..20 {
        client.list_all_tools().await.expect("tools/list");
        spawn(&client, "output warm").await;
    }

    let mut list = Vec::with_capacity(samples);
    for _ in 0..samples {
        let t = Instant::now();
        client.list_all_tools().await.expect("tools/list");
        list.push(t.elapsed());
    }
    report("tools/list (stdio)", list);

    let mut spawns = Vec::with_capacity(samples);
    for _ in 0..samples {
        let t = Instant::now();
        spawn(&client, "output bench").await;
        spawns.push(t.elapsed());
    }
    report("agent_spawn background", spawns);

    // Empty the inbox of what the spawns above left.
    loop {
        let drained = client
            .call_tool(
                CallToolRequestParams::new("agent_await").with_arguments(args(
                    json!({"ids": null, "mode": "any", "timeout_seconds": 0.2}),
                )),
            )
            .await
            .expect("agent_await");
        let text = drained.content[0]
            .as_text()
            .map(|t| t.text.clone())
            .unwrap_or_default();
        if text.contains("timed out") || text.contains("Nothing to wait for") {
            break;
        }
    }
    let wakeups = samples.min(100);
    let mut wake = Vec::with_capacity(wakeups);
    for _ in 0..wakeups {
        let id = spawn(&client, "wait_steer\noutput woke").await;
        let waiting = async {
            let answer = client
                .call_tool(
                    CallToolRequestParams::new("agent_await").with_arguments(args(
                        json!({"ids": null, "mode": "any", "timeout_seconds": 30}),
                    )),
                )
                .await;
            (answer, Instant::now())
        };
        let steer = async {
            // Let the await reach the server and wait there.
            tokio::time::sleep(Duration::from_millis(20)).await;
            let sent = Instant::now();
            grpc.steer(pb::SteerRequest {
                id: id.clone(),
                message: "go".into(),
            })
            .await
            .expect("steer");
            sent
        };
        let ((answer, answered), steered) = tokio::join!(waiting, steer);
        let text = answer.expect("agent_await").content[0]
            .as_text()
            .map(|t| t.text.clone())
            .unwrap_or_default();
        assert!(text.contains(&id), "{text}");
        wake.push(answered.saturating_duration_since(steered));
    }
    report("agent_await wake-up", wake);
    client.cancel().await.expect("close");
    server.shutdown().await.expect("shutdown");
}
