//! The `simulated` runner: a tiny script language in the prompt that makes
//! every state reachable for demos and tests.
//!
//! One directive per line:
//! - `sleep <ms>` waits (cancellable);
//! - `output <text>` appends a line to the result;
//! - `tool <name>` reports a tool call;
//! - `usage <input> <output>` adds tokens;
//! - `approve <tool_name>` pauses in AWAITING_APPROVAL; once decided and
//!   running again it appends `approved: <tool>` or `denied: <tool>: <note>`;
//! - `fail <message>` ends FAILED with that message;
//! - `wait_steer` waits for a steer message;
//! - any other line is appended to the result as is.
//!
//! Each steer message received appends `steer: <message>`. A prompt with no
//! directives finishes at once with the prompt as its result.

use std::time::Duration;

use futures_util::future::BoxFuture;

use super::{Run, RunOutcome, Runner};
use crate::scheduler::{AgentError, Usage, CODE_RUN_FAILED};

/// See the module docs.
#[derive(Debug, Default, Clone, Copy)]
pub struct SimulatedRunner;

impl Runner for SimulatedRunner {
    fn run(&self, run: Run) -> BoxFuture<'static, RunOutcome> {
        Box::pin(simulate(run))
    }
}

/// One parsed prompt line.
#[derive(Debug, PartialEq, Eq)]
enum Directive<'a> {
    Sleep(u64),
    Output(&'a str),
    Tool(&'a str),
    Usage(u64, u64),
    Approve(&'a str),
    Fail(&'a str),
    WaitSteer,
    Text(&'a str),
}

fn parse(line: &str) -> Directive<'_> {
    let trimmed = line.trim();
    let (word, rest) = trimmed.split_once(' ').unwrap_or((trimmed, ""));
    let rest = rest.trim();
    match word {
        "sleep" => rest.parse().map_or(Directive::Text(line), Directive::Sleep),
        "output" => Directive::Output(rest),
        "tool" if !rest.is_empty() => Directive::Tool(rest),
        "usage" => {
            let mut parts = rest.split_whitespace().map(str::parse::<u64>);
            match (parts.next(), parts.next(), parts.next()) {
                (Some(Ok(i)), Some(Ok(o)), None) => Directive::Usage(i, o),
                _ => Directive::Text(line),
            }
        }
        "approve" if !rest.is_empty() => Directive::Approve(rest),
        "fail" => Directive::Fail(rest),
        "wait_steer" if rest.is_empty() => Directive::WaitSteer,
        _ => Directive::Text(line),
    }
}

async fn simulate(mut run: Run) -> RunOutcome {
    let prompt = run.prompt.clone();
    let has_directives = prompt
        .lines()
        .any(|l| !matches!(parse(l), Directive::Text(_)));
    if !has_directives {
        let mut result = prompt.to_string();
        while let Some(msg) = run.steer.try_recv() {
            result.push('\n');
            result.push_str(&steer_line(&msg));
        }
        return Ok(result);
    }
    let mut lines: Vec<String> = Vec::new();
    // Output is reported in chunks that concatenate to the result: each
    // line after the first starts with its separating newline.
    let emit = |lines: &mut Vec<String>, run: &Run, text: String| {
        if lines.is_empty() {
            run.reporter.output(&text);
        } else {
            run.reporter.output(&format!("\n{text}"));
        }
        lines.push(text);
    };
    for line in prompt.lines() {
        match parse(line) {
            Directive::Sleep(ms) => {
                let sleep = tokio::time::sleep(Duration::from_millis(ms));
                tokio::pin!(sleep);
                loop {
                    tokio::select! {
                        () = &mut sleep => break,
                        Some(msg) = run.steer.recv() => emit(&mut lines, &run, steer_line(&msg)),
                    }
                }
            }
            Directive::Output(text) => emit(&mut lines, &run, text.to_owned()),
            Directive::Text(text) => emit(&mut lines, &run, text.to_owned()),
            Directive::Tool(name) => run.reporter.tool_call(name, ""),
            Directive::Usage(input, output) => run.reporter.usage(Usage {
                input_tokens: input,
                output_tokens: output,
                tool_calls: 0,
            }),
            Directive::Approve(tool) => {
                let outcome = run.reporter.request_approval(tool, "").await;
                let line = match (outcome.approved, outcome.note.is_empty()) {
                    (true, _) => format!("approved: {tool}"),
                    (false, true) => format!("denied: {tool}"),
                    (false, false) => format!("denied: {tool}: {}", outcome.note),
                };
                emit(&mut lines, &run, line);
            }
            Directive::Fail(message) => {
                return Err(AgentError::new(CODE_RUN_FAILED, message));
            }
            Directive::WaitSteer => match run.steer.recv().await {
                Some(msg) => emit(&mut lines, &run, steer_line(&msg)),
                // The scheduler dropped the sender: the run is ending.
                None => std::future::pending().await,
            },
        }
    }
    while let Some(msg) = run.steer.try_recv() {
        emit(&mut lines, &run, steer_line(&msg));
    }
    Ok(lines.join("\n"))
}

fn steer_line(msg: &str) -> String {
    format!("steer: {msg}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directives_parse_and_anything_else_is_text() {
        assert_eq!(parse("sleep 50"), Directive::Sleep(50));
        assert_eq!(
            parse("  output hello world "),
            Directive::Output("hello world")
        );
        assert_eq!(parse("tool grep"), Directive::Tool("grep"));
        assert_eq!(parse("usage 10 20"), Directive::Usage(10, 20));
        assert_eq!(parse("approve shell"), Directive::Approve("shell"));
        assert_eq!(parse("fail boom"), Directive::Fail("boom"));
        assert_eq!(parse("wait_steer"), Directive::WaitSteer);
        assert_eq!(parse("sleep soon"), Directive::Text("sleep soon"));
        assert_eq!(parse("usage 1"), Directive::Text("usage 1"));
        assert_eq!(parse("hello"), Directive::Text("hello"));
    }
}
