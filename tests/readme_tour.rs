//! The README's "A five-minute tour" runs as written: every `sa …` command of
//! the tour is run against the built binary, and what the tour's comments
//! promise is what the CLI prints and its exit status.
//!
//! So that the tour cannot drift from the test, the commands are written
//! here as the README spells them (`sa` for the binary, `"$ID"` for an id
//! the tour captured) and each is checked to appear verbatim in the tour's
//! code blocks, read from README.md at test time, before it is split into
//! arguments and run. Lines the tour pipes through `jq` are run without it:
//! the test reads the same path from the JSON with serde_json.

mod common;

use std::{collections::HashMap, process::Output};

use common::{
    child::ChildServer,
    cli::{stderr, stdout, subagentd_async, CliChild},
};

/// The README's heading of the tour.
const TOUR_HEADING: &str = "## A five-minute tour";

#[tokio::test]
async fn the_readme_tour_runs_as_written() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("README.md is readable");
    let mut tour = Tour::new(&readme);
    // `sa` is the binary, served with the built-in default config (the
    // tour's limits and error texts are those of the defaults).
    tour.assert_shows("alias sa=./target/release/subagentd");
    tour.assert_shows("./target/release/subagentd serve &");
    let server = ChildServer::start("", &[]).await;
    tour.addr = format!("http://{}", server.addr);

    // Foreground: settled with its result.
    let out = tour
        .run("sa spawn --agent simulated --model acme/small --prompt 'hello'")
        .await;
    let hello = summary(&out);
    assert_eq!(hello.status, "done", "{}", stdout(&out));
    assert!(
        stdout(&out).contains("\n  result:\n    hello\n"),
        "{}",
        stdout(&out)
    );

    // Background: returns at once, RUNNING or QUEUED.
    let agent = tour
        .capture(
            "ID",
            r"sa spawn --json --background --agent simulated --model acme/small --prompt $'sleep 2000\noutput step one\nwait_steer'",
            ".id",
        )
        .await;
    let status = agent["status"].as_str().unwrap();
    assert!(
        ["AGENT_STATUS_RUNNING", "AGENT_STATUS_QUEUED"].contains(&status),
        "{agent}"
    );
    let steered_id = tour.var("ID");

    let out = tour.run(r#"sa status "$ID""#).await;
    let now = summary(&out);
    assert_eq!(now.id, steered_id);
    assert_eq!(now.status, "running", "{}", stdout(&out));

    // The steer reaches the run during its `sleep 2000`; the `wait_steer`
    // after it must count it rather than wait for another one.
    let steer = r#"sa steer "$ID" "go on""#;
    let promise = tour.comment_of(steer);
    assert_eq!(promise, "DELIVERED to the running run");
    let out = tour.run(steer).await;
    let first_line = stdout(&out).lines().next().unwrap_or_default().to_owned();
    assert_eq!(
        first_line,
        format!("steer message {}", promise.to_lowercase()),
        "{}",
        stdout(&out)
    );

    let wait = r#"sa await "$ID" --timeout 10s"#;
    assert_eq!(tour.comment_of(wait), "exit 2 if it timed out");
    let out = tour.run_status(wait).await;
    assert_eq!(
        out.status.code(),
        Some(0),
        "the steered agent settles (exit 2: timed out)\n{}{}",
        stdout(&out),
        stderr(&out)
    );
    let done = summary(&out);
    assert_eq!(done.status, "done", "{}", stdout(&out));
    assert!(
        stdout(&out).contains("\n  result:\n    steer: go on\n    step one\n"),
        "the steer arrived during the sleep and was appended once:\n{}",
        stdout(&out)
    );

    // Watch: a SNAPSHOT of every agent first, then live events.
    let watch = "sa watch --snapshot";
    assert_eq!(
        tour.comment_of(watch),
        "SNAPSHOT of every agent, then live events"
    );
    tour.assert_shows(&format!("{watch} &"));
    let mut watch = tour.start(watch);
    let mut snapshots = Vec::new();
    while snapshots.len() < 2 {
        let event = next_event(&mut watch).await;
        assert_eq!(event.kind, "snapshot", "snapshots come first: {event:?}");
        snapshots.push(event.id);
    }
    snapshots.sort();
    let mut known = vec![hello.id.clone(), steered_id.clone()];
    known.sort();
    assert_eq!(snapshots, known, "one SNAPSHOT per agent");

    let out = tour
        .run("sa spawn --background --agent simulated --model acme/small --prompt 'sleep 60000'")
        .await;
    let sleeper = summary(&out);
    assert!(
        ["running", "queued"].contains(&sleeper.status.as_str()),
        "{}",
        stdout(&out)
    );
    tour.set("<that id>", &sleeper.id);
    let out = tour
        .run(r#"sa cancel --id <that id> --reason "changed my mind""#)
        .await;
    let text = stdout(&out);
    assert!(text.starts_with("cancelled 1 agent\n"), "{text}");
    assert!(text.contains(&sleeper.id), "{text}");
    assert!(text.contains("changed my mind"), "{text}");
    let live: Vec<Event> =
        read_events_until(&mut watch, |e| e.id == sleeper.id && e.kind == "cancelled").await;
    assert!(
        live.iter()
            .all(|e| e.id == sleeper.id && e.kind != "snapshot"),
        "only live events of the new agent follow the snapshot: {live:?}"
    );
    assert!(live.iter().any(|e| e.kind == "started"), "{live:?}");
    watch.kill().await;

    // Approvals: the run pauses, a person decides, the run continues.
    let agent = tour
        .capture(
            "ID",
            r"sa spawn --json --background --agent simulated --model acme/small --prompt $'approve shell\noutput after the call'",
            ".id",
        )
        .await;
    assert_eq!(agent["background"], true);
    let approving_id = tour.var("ID");
    let wait = r#"sa await "$ID""#;
    let promises = tour.comments_of(wait);
    assert_eq!(
        promises,
        [
            "settled: AWAITING_APPROVAL, shows the approval id",
            r#"DONE: "approved: shell" / "after the call""#
        ]
    );
    let out = tour.run(wait).await;
    let paused = summary(&out);
    assert_eq!(paused.id, approving_id);
    assert_eq!(paused.status, state_word("AWAITING_APPROVAL"));
    let shown_approval = stdout(&out)
        .lines()
        .find_map(|l| l.strip_prefix("  approval: shell (approval id "))
        .and_then(|rest| rest.strip_suffix(')'))
        .unwrap_or_else(|| panic!("the approval id is shown:\n{}", stdout(&out)))
        .to_owned();

    let status = tour
        .capture("APPROVAL", r#"sa status --json "$ID""#, ".approval.id")
        .await;
    assert_eq!(status["approval"]["toolName"], "shell");
    assert_eq!(tour.var("APPROVAL"), shown_approval);

    let approve = r#"sa approve "$ID" "$APPROVAL""#;
    assert_eq!(
        tour.comment_of(approve),
        r#"or: --deny --note "not on prod""#
    );
    let out = tour.run(approve).await;
    assert!(
        stdout(&out).starts_with("approved; the run continues when the agent runs again\n"),
        "{}",
        stdout(&out)
    );

    let out = tour.run(wait).await;
    let done = summary(&out);
    assert_eq!(done.status, state_word("DONE"));
    assert!(
        stdout(&out).contains("\n  result:\n    approved: shell\n    after the call\n"),
        "{}",
        stdout(&out)
    );

    // `watch --progress` prints nothing until something happens, so when it
    // is subscribed cannot be told from its output; the tour shows it, and
    // tests/progress.rs covers what it streams.
    assert_eq!(
        tour.comment_of("sa watch --progress"),
        "also output chunks and tool calls as runs report them"
    );

    // The global cap: the 6th live background agent is refused.
    let spawn = "sa spawn --background --agent simulated --model acme/small --prompt 'sleep 60000'";
    let for_loop = format!("for i in 1 2 3 4 5 6; do {spawn}; done");
    tour.assert_shows(&for_loop);
    // Nothing else is live by now: five are admitted, the sixth is refused.
    for _ in 0..5 {
        let out = tour.run(spawn).await;
        let admitted = summary(&out);
        assert!(
            ["running", "queued"].contains(&admitted.status.as_str()),
            "{}",
            stdout(&out)
        );
    }
    let out = tour.run_status(spawn).await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(out.stdout.is_empty(), "{}", stdout(&out));
    let shown = tour.comment_lines_after(&for_loop);
    let err = stderr(&out);
    let printed: Vec<&str> = err.lines().collect();
    assert_eq!(
        shown.len(),
        printed.len(),
        "the README shows every error line:\n{err}"
    );
    for (shown, printed) in shown.iter().zip(&printed) {
        match shown.strip_suffix(" ...") {
            Some(prefix) => assert!(printed.starts_with(prefix), "{printed:?} vs {shown:?}"),
            None => assert_eq!(printed, shown),
        }
    }
}

/// The tour's code blocks, and the values its shell variables hold.
struct Tour {
    /// The `sh` blocks of the tour, continuation lines joined.
    text: String,
    /// The server address passed as `--addr`.
    addr: String,
    /// `$NAME` and placeholders such as `<that id>` → their value.
    vars: HashMap<String, String>,
}

impl Tour {
    fn new(readme: &str) -> Self {
        let start = readme
            .find(&format!("\n{TOUR_HEADING}\n"))
            .expect("the README has the tour");
        let section = &readme[start + TOUR_HEADING.len() + 2..];
        let section = &section[..section.find("\n## ").unwrap_or(section.len())];
        let mut text = String::new();
        let mut in_block = false;
        for line in section.lines() {
            match (in_block, line.trim()) {
                (false, "```sh") => in_block = true,
                (true, "```") => in_block = false,
                (true, _) => {
                    text.push_str(line);
                    text.push('\n');
                }
                _ => {}
            }
        }
        assert!(!text.is_empty(), "the tour has sh code blocks");
        // A line ending in `\` goes on with the next line's words.
        let mut joined = String::new();
        let mut lines = text.lines();
        while let Some(line) = lines.next() {
            let mut line = line.to_owned();
            while let Some(head) = line.strip_suffix('\\') {
                let next = lines.next().expect("a continued line goes on");
                line = format!("{} {}", head.trim_end(), next.trim_start());
            }
            joined.push_str(&line);
            joined.push('\n');
        }
        Self {
            text: joined,
            addr: String::new(),
            vars: HashMap::new(),
        }
    }

    fn var(&self, name: &str) -> String {
        self.vars[name].clone()
    }

    fn set(&mut self, name: &str, value: &str) {
        self.vars.insert(name.to_owned(), value.to_owned());
    }

    fn assert_shows(&self, text: &str) {
        assert!(
            self.text.contains(text),
            "the README's tour shows {text:?}; it has:\n{}",
            self.text
        );
    }

    /// The rest of the line after each place where `command` stands as a
    /// whole command: followed by the end of the line, a comment, `;`, `|`,
    /// `)` or `&`, not by more arguments.
    fn occurrences(&self, command: &str) -> Vec<&str> {
        let found: Vec<&str> = self
            .text
            .match_indices(command)
            .map(|(i, _)| {
                let rest = &self.text[i + command.len()..];
                &rest[..rest.find('\n').unwrap_or(rest.len())]
            })
            .filter(|rest| {
                rest.trim_start().is_empty()
                    || rest.trim_start().starts_with(['#', ';', '|', ')', '&'])
            })
            .collect();
        assert!(
            !found.is_empty(),
            "the README's tour shows the command {command:?}; it has:\n{}",
            self.text
        );
        found
    }

    /// The comments on the lines of `command`, in README order.
    fn comments_of(&self, command: &str) -> Vec<&str> {
        self.occurrences(command)
            .into_iter()
            .filter_map(|rest| rest.split_once('#').map(|(_, c)| c.trim()))
            .collect()
    }

    /// The one comment on the line of `command`.
    fn comment_of(&self, command: &str) -> &str {
        match self.comments_of(command)[..] {
            [comment] => comment,
            ref other => panic!("{command:?} has one comment in the tour, not {other:?}"),
        }
    }

    /// The comment lines right after the line that has `text`, without
    /// their `# `.
    fn comment_lines_after(&self, text: &str) -> Vec<&str> {
        let mut lines = self.text.lines();
        lines
            .by_ref()
            .find(|l| l.contains(text))
            .expect("the line is in the tour");
        lines
            .map_while(|l| l.strip_prefix("# "))
            .collect::<Vec<_>>()
    }

    /// The arguments of `command` (which starts with `sa `): shell words
    /// with the tour's variables substituted, and `--addr` added after the
    /// subcommand.
    fn args(&self, command: &str) -> Vec<String> {
        let mut command = command.to_owned();
        for (name, value) in &self.vars {
            if name.starts_with('<') {
                command = command.replace(name, value);
            }
        }
        let mut words = shell_words(&command, &self.vars);
        assert_eq!(words.remove(0), "sa", "{command}");
        words.insert(1, "--addr".into());
        words.insert(2, self.addr.clone());
        words
    }

    /// Runs `command` after checking the tour shows it, and returns what it
    /// printed; panics unless it exited 0.
    async fn run(&self, command: &str) -> Output {
        let out = self.run_status(command).await;
        assert!(
            out.status.success(),
            "{command}: {:?}\n{}{}",
            out.status,
            stdout(&out),
            stderr(&out)
        );
        out
    }

    /// [`Tour::run`] with any exit status.
    async fn run_status(&self, command: &str) -> Output {
        self.occurrences(command);
        subagentd_async(self.args(command)).await
    }

    /// Starts a command that keeps running, after checking the tour shows it.
    fn start(&self, command: &str) -> CliChild {
        self.occurrences(command);
        let args = self.args(command);
        CliChild::start(&args.iter().map(String::as_str).collect::<Vec<_>>())
    }

    /// Runs the tour's `NAME=$(command | jq -r PATH)`: `command` prints one
    /// JSON object, PATH's value becomes `$NAME`. Returns the object.
    async fn capture(&mut self, name: &str, command: &str, path: &str) -> serde_json::Value {
        self.assert_shows(&format!("{name}=$({command} | jq -r {path})"));
        let out = self.run(command).await;
        let value: serde_json::Value = serde_json::from_str(&stdout(&out))
            .unwrap_or_else(|e| panic!("{command} prints one JSON object: {e}\n{}", stdout(&out)));
        let pointer = path.replace('.', "/");
        let picked = value
            .pointer(&pointer)
            .and_then(serde_json::Value::as_str)
            .unwrap_or_else(|| panic!("{command} prints {path}: {value}"));
        self.set(name, picked);
        value
    }
}

/// Splits `line` into words as a POSIX shell does for the forms the tour
/// uses: blanks between words, '…' literally, "…" and bare words with
/// `$NAME` substituted from `vars`, and $'…' with `\n` as a newline.
fn shell_words(line: &str, vars: &HashMap<String, String>) -> Vec<String> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut chars = line.chars().peekable();
    let expand = |chars: &mut std::iter::Peekable<std::str::Chars<'_>>| {
        let mut name = String::new();
        while let Some(&c) = chars.peek() {
            if !(c.is_ascii_alphanumeric() || c == '_') {
                break;
            }
            name.push(c);
            chars.next();
        }
        vars.get(&name)
            .unwrap_or_else(|| panic!("${name} is set before {line:?}"))
            .clone()
    };
    while let Some(c) = chars.next() {
        match c {
            ' ' | '\t' => words.extend(word.take()),
            '\'' => {
                let w = word.get_or_insert_with(String::new);
                w.extend(chars.by_ref().take_while(|&c| c != '\''));
            }
            '"' => {
                let w = word.get_or_insert_with(String::new);
                while let Some(c) = chars.next() {
                    match c {
                        '"' => break,
                        '$' => w.push_str(&expand(&mut chars)),
                        c => w.push(c),
                    }
                }
            }
            '$' if chars.peek() == Some(&'\'') => {
                chars.next();
                let w = word.get_or_insert_with(String::new);
                while let Some(c) = chars.next() {
                    match (c, chars.peek()) {
                        ('\'', _) => break,
                        ('\\', Some('n')) => {
                            chars.next();
                            w.push('\n');
                        }
                        (c, _) => w.push(c),
                    }
                }
            }
            '$' => {
                let value = expand(&mut chars);
                word.get_or_insert_with(String::new).push_str(&value);
            }
            c => word.get_or_insert_with(String::new).push(c),
        }
    }
    words.extend(word);
    words
}

/// The state names the tour's comments use (`AWAITING_APPROVAL`) as the
/// CLI's text output prints them (`awaiting-approval`).
fn state_word(name: &str) -> String {
    name.to_lowercase().replace('_', "-")
}

/// The summary line the CLI prints first for an agent.
#[derive(Debug)]
struct Summary {
    id: String,
    status: String,
}

fn summary(out: &Output) -> Summary {
    let text = stdout(out);
    let mut words = text.lines().next().unwrap_or_default().split_whitespace();
    let (Some(id), Some(status)) = (words.next(), words.next()) else {
        panic!("an agent summary line:\n{text}");
    };
    uuid::Uuid::parse_str(id).unwrap_or_else(|e| panic!("{e}: {text}"));
    Summary {
        id: id.to_owned(),
        status: status.to_owned(),
    }
}

/// One `#<sequence>  <kind>  <id> …` line of `watch`.
#[derive(Debug)]
struct Event {
    kind: String,
    id: String,
}

/// The next event line of `watch` (skipping its indented detail lines).
async fn next_event(watch: &mut CliChild) -> Event {
    loop {
        let line = watch.next_line().await;
        if line.starts_with("  ") {
            continue;
        }
        let mut words = line.split_whitespace();
        let (Some(sequence), Some(kind), Some(id)) = (words.next(), words.next(), words.next())
        else {
            panic!("a watch event line: {line:?}");
        };
        assert!(sequence.starts_with('#'), "{line:?}");
        return Event {
            kind: kind.to_owned(),
            id: id.to_owned(),
        };
    }
}

/// Events until one passes `last` (included).
async fn read_events_until(watch: &mut CliChild, last: impl Fn(&Event) -> bool) -> Vec<Event> {
    let mut events = Vec::new();
    loop {
        let event = next_event(watch).await;
        let done = last(&event);
        events.push(event);
        if done {
            return events;
        }
    }
}
