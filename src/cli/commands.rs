//! Running a client subcommand: connect to the server at `--addr`, make
//! the request its flags describe, print the response (see
//! [`super::output`]).

use std::io::{self, IsTerminal as _, Read as _, Write as _};
use std::process::ExitCode;
use std::time::Duration;

use serde_json::{json, Value};
use tonic::{
    service::interceptor::InterceptedService,
    transport::{Channel, Endpoint},
};

use super::{args::*, output, Command};
use crate::client::{bearer_header, normalize_addr, Credential, MAX_RESPONSE_BYTES};
use crate::pb;
use crate::pb::agent_service_client::AgentServiceClient;

/// Exit status of `await` when the timeout passed before the condition held.
pub const EXIT_AWAIT_TIMED_OUT: u8 = 2;

/// How long to wait for the TCP/HTTP2 connection before reporting the server
/// unreachable; without it a black-holed address hangs for minutes.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

type Client = AgentServiceClient<InterceptedService<Channel, Credential>>;

/// Why a client subcommand failed; printed as `error: <this>` with exit
/// status 1.
#[derive(Debug, thiserror::Error)]
enum CliError {
    #[error("invalid --addr {addr:?}: {reason}")]
    InvalidAddr { addr: String, reason: String },
    #[error("cannot connect to subagentd at {addr}: {}", error_chain(.source))]
    Connect {
        addr: String,
        source: tonic::transport::Error,
    },
    #[error("{}", output::status_error(.0))]
    Rpc(tonic::Status),
    /// A watch stream that broke after some events: says where to resume.
    #[error("{}\nhint: resume with --after-sequence {last_sequence}", output::status_error(.status))]
    WatchBroken {
        status: tonic::Status,
        last_sequence: u64,
    },
    #[error("the API key (--token or SUBAGENTD_TOKEN) contains characters a header cannot carry")]
    InvalidToken,
    #[error("{0}")]
    Tls(crate::tls::ClientTlsError),
    #[error("{0}")]
    Prompt(String),
    #[error("{command}: the server returned next page token {token:?} twice; stopping")]
    PageLoop {
        command: &'static str,
        token: String,
    },
    #[error("writing output: {0}")]
    Output(#[from] io::Error),
}

impl From<tonic::Status> for CliError {
    fn from(status: tonic::Status) -> Self {
        CliError::Rpc(status)
    }
}

/// `error` and its sources joined with ": ", because tonic's transport error
/// alone only says "transport error".
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        // Some layers repeat their source's message; print it once.
        if !text.ends_with(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// Runs a client subcommand against the server and returns the exit status:
/// 0 on success, 1 after printing `error: …` to stderr for a gRPC error, an
/// unreachable server or unusable input, and [`EXIT_AWAIT_TIMED_OUT`] when
/// `await` timed out.
///
/// # Errors
///
/// Only for [`Command::Serve`], which is not a client command: `main` must run
/// the server itself. Every other failure is reported and turned into exit
/// status 1 here, so that the message format is the same for all of them.
pub async fn run(cmd: Command) -> anyhow::Result<ExitCode> {
    let result = match cmd {
        Command::Serve(_) | Command::Worker(_) | Command::Keys(_) | Command::Mcp(_) => {
            anyhow::bail!("`serve`, `worker`, `mcp` and `keys` are not client commands")
        }
        Command::Spawn(args) => spawn(args).await,
        Command::Status(args) => status(args).await,
        Command::Await(args) => await_agents(args).await,
        Command::Cancel(args) => cancel(args).await,
        Command::Steer(args) => steer(args).await,
        Command::Approve(args) => approve(args).await,
        Command::Watch(args) => watch(args).await,
        Command::Transcript(args) => transcript(args).await,
    };
    match result {
        Ok(code) => Ok(code),
        // The reader went away (`| head`): what it wanted has been written.
        Err(CliError::Output(e)) if e.kind() == io::ErrorKind::BrokenPipe => Ok(ExitCode::SUCCESS),
        Err(error) => {
            // Nothing better to do if stderr itself is gone.
            let _ = writeln!(io::stderr().lock(), "error: {error}");
            Ok(ExitCode::FAILURE)
        }
    }
}

async fn connect(args: &ClientArgs) -> Result<Client, CliError> {
    let credential =
        Credential(bearer_header(args.token.as_deref()).map_err(|_| CliError::InvalidToken)?);
    let (url, tls) = args
        .tls
        .secure(normalize_addr(&args.addr))
        .map_err(CliError::Tls)?;
    let mut endpoint = Endpoint::from_shared(url.clone())
        .map_err(|e| CliError::InvalidAddr {
            addr: args.addr.clone(),
            reason: error_chain(&e),
        })?
        .connect_timeout(CONNECT_TIMEOUT);
    if let Some(config) = tls {
        endpoint = endpoint
            .tls_config(config)
            .map_err(|source| CliError::Connect {
                addr: url.clone(),
                source,
            })?;
    }
    let channel = endpoint
        .connect()
        .await
        .map_err(|source| CliError::Connect { addr: url, source })?;
    Ok(AgentServiceClient::with_interceptor(channel, credential)
        .max_decoding_message_size(MAX_RESPONSE_BYTES))
}

/// Writes output for one invocation: JSON lines or text. Takes the stdout
/// lock per write, so no lock is held across an `.await`.
struct Printer {
    json: bool,
}

impl Printer {
    fn new(args: &ClientArgs) -> Self {
        Self { json: args.json }
    }

    fn agent(&self, agent: &pb::Agent, with_result: bool) -> io::Result<()> {
        if self.json {
            self.json_line(&output::agent_json(agent))
        } else {
            self.text(&output::agent_human(agent, with_result))
        }
    }

    fn json_line(&self, value: &Value) -> io::Result<()> {
        let mut out = io::stdout().lock();
        serde_json::to_writer(&mut out, value)?;
        out.write_all(b"\n")?;
        out.flush()
    }

    fn text(&self, text: &str) -> io::Result<()> {
        let mut out = io::stdout().lock();
        out.write_all(text.as_bytes())?;
        out.flush()
    }

    /// A status line for people; suppressed with `--json`, whose stdout
    /// carries only the documented objects.
    fn note(&self, text: &str) -> io::Result<()> {
        if self.json {
            Ok(())
        } else {
            self.text(&format!("{text}\n"))
        }
    }
}

async fn read_prompt(source: PromptSource) -> Result<String, CliError> {
    let (prompt, origin) = match source {
        PromptSource::Inline(text) => (text, "--prompt".to_owned()),
        PromptSource::File(path) => {
            let origin = path.display().to_string();
            let text = std::fs::read_to_string(&path).map_err(|e| {
                CliError::Prompt(format!("cannot read --prompt-file {origin}: {e}"))
            })?;
            (text, origin)
        }
        PromptSource::Stdin => {
            if io::stdin().is_terminal() {
                let _ = writeln!(
                    io::stderr(),
                    "reading the prompt from stdin; end it with Ctrl-D (or pass --prompt)"
                );
            }
            // Reading stdin blocks; keep it off the runtime's workers.
            let text = tokio::task::spawn_blocking(|| {
                let mut text = String::new();
                io::stdin().read_to_string(&mut text).map(|_| text)
            })
            .await
            .map_err(|e| CliError::Prompt(format!("reading the prompt from stdin: {e}")))?
            .map_err(|e| CliError::Prompt(format!("reading the prompt from stdin: {e}")))?;
            (text, "stdin".to_owned())
        }
    };
    if prompt.is_empty() {
        return Err(CliError::Prompt(format!(
            "the prompt from {origin} is empty; pass --prompt TEXT, --prompt-file PATH or pipe it on stdin"
        )));
    }
    Ok(prompt)
}

async fn spawn(args: SpawnArgs) -> Result<ExitCode, CliError> {
    // Read the prompt first so a missing prompt is reported without a
    // connection attempt.
    let prompt = read_prompt(args.prompt_source()).await?;
    let mut client = connect(&args.client).await?;
    let response = client.spawn(args.to_request(prompt)).await?.into_inner();
    let printer = Printer::new(&args.client);
    if let Some(agent) = &response.agent {
        printer.agent(agent, true)?;
    }
    Ok(ExitCode::SUCCESS)
}

async fn status(args: StatusArgs) -> Result<ExitCode, CliError> {
    let mut client = connect(&args.client).await?;
    let printer = Printer::new(&args.client);
    let mut request = args.to_request();
    let mut printed = 0usize;
    loop {
        let response = client.status(request.clone()).await?.into_inner();
        for agent in &response.agents {
            printer.agent(agent, true)?;
        }
        printed += response.agents.len();
        let next = response.next_page_token;
        if next.is_empty() {
            break;
        }
        if !args.all_pages {
            if printer.json {
                printer.json_line(&json!({ "nextPageToken": next }))?;
            } else {
                printer.note(&format!("more agents: --page-token {next}"))?;
            }
            break;
        }
        // A server bug must not turn --all-pages into an endless loop.
        if next == request.page_token {
            return Err(CliError::PageLoop {
                command: "status",
                token: next,
            });
        }
        request.page_token = next;
    }
    if printed == 0 {
        printer.note("no agents")?;
    }
    Ok(ExitCode::SUCCESS)
}

async fn await_agents(args: AwaitArgs) -> Result<ExitCode, CliError> {
    let mut client = connect(&args.client).await?;
    let printer = Printer::new(&args.client);
    let response = client.r#await(args.to_request()).await?.into_inner();
    for agent in &response.agents {
        printer.agent(agent, true)?;
    }
    if printer.json {
        printer.json_line(&json!({ "timedOut": response.timed_out }))?;
    }
    if !response.timed_out {
        return Ok(ExitCode::SUCCESS);
    }
    if !printer.json {
        let settled = response
            .agents
            .iter()
            .filter(|a| output::is_settled(a.status))
            .count();
        let _ = writeln!(
            io::stderr(),
            "timed out: {settled} of {} agents settled",
            response.agents.len()
        );
    }
    Ok(ExitCode::from(EXIT_AWAIT_TIMED_OUT))
}

async fn cancel(args: CancelArgs) -> Result<ExitCode, CliError> {
    let mut client = connect(&args.client).await?;
    let printer = Printer::new(&args.client);
    let response = client.cancel(args.to_request()).await?.into_inner();
    match response.agents.len() {
        0 => printer.note("no live agents to cancel")?,
        1 => printer.note("cancelled 1 agent")?,
        n => printer.note(&format!("cancelled {n} agents"))?,
    }
    for agent in &response.agents {
        printer.agent(agent, false)?;
    }
    Ok(ExitCode::SUCCESS)
}

async fn steer(args: SteerArgs) -> Result<ExitCode, CliError> {
    let mut client = connect(&args.client).await?;
    let printer = Printer::new(&args.client);
    let response = client.steer(args.to_request()).await?.into_inner();
    if printer.json {
        printer.json_line(&output::steer_json(&response))?;
        return Ok(ExitCode::SUCCESS);
    }
    let delivery = match pb::SteerDelivery::try_from(response.delivery) {
        Ok(pb::SteerDelivery::Delivered) => "delivered to the running run".to_owned(),
        Ok(pb::SteerDelivery::Buffered) => "buffered until the run (re)starts".to_owned(),
        _ => format!("delivery {}", response.delivery),
    };
    printer.note(&format!("steer message {delivery}"))?;
    if let Some(agent) = &response.agent {
        printer.agent(agent, false)?;
    }
    Ok(ExitCode::SUCCESS)
}

async fn approve(args: ApproveArgs) -> Result<ExitCode, CliError> {
    let mut client = connect(&args.client).await?;
    let printer = Printer::new(&args.client);
    let response = client.approve(args.to_request()).await?.into_inner();
    if let Some(agent) = &response.agent {
        if !printer.json {
            let verb = if args.deny { "denied" } else { "approved" };
            printer.note(&format!(
                "{verb}; the run continues when the agent runs again"
            ))?;
        }
        printer.agent(agent, false)?;
    }
    Ok(ExitCode::SUCCESS)
}

async fn transcript(args: TranscriptArgs) -> Result<ExitCode, CliError> {
    let mut client = connect(&args.client).await?;
    let printer = Printer::new(&args.client);
    let mut request = args.to_request();
    let mut printed = 0usize;
    loop {
        let response = client.get_transcript(request.clone()).await?.into_inner();
        if printed == 0 && request.page_token.is_empty() {
            printer.note(&format!("conversation {}", response.conversation_id))?;
        }
        for entry in &response.entries {
            if printer.json {
                printer.json_line(&output::transcript_entry_json(entry))?;
            } else {
                printer.text(&output::transcript_entry_human(entry))?;
            }
        }
        printed += response.entries.len();
        let next = response.next_page_token;
        if next.is_empty() {
            break;
        }
        // A server bug must not turn paging into an endless loop.
        if next == request.page_token {
            return Err(CliError::PageLoop {
                command: "transcript",
                token: next,
            });
        }
        request.page_token = next;
    }
    if printed == 0 {
        printer.note("no entries")?;
    }
    Ok(ExitCode::SUCCESS)
}

async fn watch(args: WatchArgs) -> Result<ExitCode, CliError> {
    let mut client = connect(&args.client).await?;
    let printer = Printer::new(&args.client);
    let mut stream = client.watch_agents(args.to_request()).await?.into_inner();
    // If the handler cannot be installed, Ctrl-C keeps its default effect
    // (ending the process), which is what the user asked for anyway.
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    tokio::pin!(ctrl_c);
    let mut last_sequence = args.after_sequence;
    loop {
        tokio::select! {
            () = &mut ctrl_c => return Ok(ExitCode::SUCCESS),
            message = stream.message() => match message {
                Ok(Some(event)) => {
                    last_sequence = last_sequence.max(event.sequence);
                    if printer.json {
                        printer.json_line(&output::event_json(&event))?;
                    } else {
                        printer.text(&output::event_human(&event))?;
                    }
                }
                Ok(None) => return Ok(ExitCode::SUCCESS),
                Err(status) if last_sequence > 0 => {
                    return Err(CliError::WatchBroken { status, last_sequence });
                }
                Err(status) => return Err(CliError::Rpc(status)),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::Cli;
    use crate::client::TlsArgs;

    fn parse(args: &[&str]) -> Command {
        let argv = std::iter::once("subagentd").chain(args.iter().copied());
        Cli::try_parse_from(argv)
            .unwrap_or_else(|e| panic!("{args:?}: {e}"))
            .command
    }
    #[test]
    fn serve_is_not_a_client_command() {
        let result = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(run(Command::Serve(crate::cli::ServeArgs::default())));
        assert!(result.is_err());
    }

    #[test]
    fn connect_error_names_the_address_and_the_cause() {
        // Port 1 on loopback is closed on any sane machine, so this fails
        // fast without starting a server.
        let args = ClientArgs {
            addr: "127.0.0.1:1".into(),
            json: false,
            token: None,
            tls: TlsArgs::default(),
        };
        let err = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(connect(&args))
            .unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with("cannot connect to subagentd at http://127.0.0.1:1: "),
            "{text}"
        );
        assert!(
            text.len() > "cannot connect to subagentd at http://127.0.0.1:1: transport error".len(),
            "{text}"
        );
    }

    #[test]
    fn spawn_reads_the_prompt_file() {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        file.write_all(b"from a file\n").unwrap();
        let path = file.path().to_str().unwrap();
        let Command::Spawn(args) = parse(&[
            "spawn",
            "--agent",
            "a",
            "--model",
            "p/m",
            "--prompt-file",
            path,
            "--json",
        ]) else {
            panic!("expected spawn");
        };
        assert!(args.client.json);
        let prompt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(read_prompt(args.prompt_source()))
            .unwrap();
        assert_eq!(prompt, "from a file\n");
    }

    #[test]
    fn spawn_rejects_an_empty_prompt() {
        let err = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(read_prompt(PromptSource::Inline(String::new())))
            .unwrap_err();
        assert!(err.to_string().contains("empty"), "{err}");
    }
}
