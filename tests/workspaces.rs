//! Workspaces (docs/workspaces.md): the `[agents.NAME]` workspace keys, and
//! each run of a workspace type in its own git worktree.

use subagentd::config::{ConfigError, ConfigSource, KeepBranch, WorkspaceKind};

fn invalid_key(toml: &str) -> (String, String) {
    match ConfigSource::from_toml_str(toml) {
        Err(ConfigError::Invalid { key, rule }) => (key, rule),
        other => panic!("expected an invalid-config error for\n{toml}\ngot {other:?}"),
    }
}

const CODER: &str = "[agents.coder]\nrunner = \"command\"\ncommand = [\"agent\"]\n";

#[test]
fn a_worktree_type_parses_with_its_values() {
    let config = ConfigSource::from_toml_str(&format!(
        "{CODER}workspace = \"worktree\"\nrepo = \"/src/app\"\nbase = \"main\"\n\
         branch_prefix = \"agents/\"\nkeep = \"always\"\nroot = \"/var/tmp/wt\"\n\
         commit_author = \"Bot <bot@example.com>\"\ncommit_message = \"{{id}}\"\n\
         max_workspace_bytes = 1000000\ncwd = \"sub/dir\"\n"
    ))
    .unwrap();
    let coder = &config.agents["coder"];
    assert_eq!(coder.workspace, WorkspaceKind::Worktree);
    assert_eq!(coder.keep, Some(KeepBranch::Always));
    assert_eq!(coder.base.as_deref(), Some("main"));
    assert_eq!(coder.max_workspace_bytes, Some(1_000_000));
}

#[test]
fn workspace_keys_are_refused_where_they_do_not_apply() {
    // A worktree needs its repository, and a command runner.
    let (key, rule) = invalid_key(&format!("{CODER}workspace = \"worktree\"\n"));
    assert_eq!(key, "agents.coder.repo", "{rule}");
    let (key, rule) =
        invalid_key("[agents.sim]\nrunner = \"simulated\"\nworkspace = \"worktree\"\n");
    assert_eq!(key, "agents.sim.workspace");
    assert!(rule.contains("runner = \"command\""), "{rule}");
    // The other keys only with workspace = "worktree", on any runner.
    for (name, line) in [
        ("repo", "repo = \"/src\""),
        ("base", "base = \"main\""),
        ("branch_prefix", "branch_prefix = \"x/\""),
        ("keep", "keep = \"never\""),
        ("root", "root = \"/tmp\""),
        ("commit_author", "commit_author = \"a\""),
        ("commit_message", "commit_message = \"m\""),
        ("max_workspace_bytes", "max_workspace_bytes = 5"),
    ] {
        for section in [CODER, "[agents.sim]\nrunner = \"simulated\"\n"] {
            let (key, rule) = invalid_key(&format!("{section}{line}\n"));
            assert!(key.ends_with(&format!(".{name}")), "{line}: {key}");
            assert!(rule.contains("workspace = \"worktree\""), "{rule}");
        }
    }
    // Values git would misread, and empty or absolute ones.
    let worktree = format!("{CODER}workspace = \"worktree\"\nrepo = \"/src\"\n");
    for (name, line) in [
        ("base", "base = \"--output=x\""),
        ("base", "base = \"a b\""),
        ("branch_prefix", "branch_prefix = \"-x\""),
        ("commit_message", "commit_message = \" \""),
        ("max_workspace_bytes", "max_workspace_bytes = 0"),
        ("cwd", "cwd = \"/abs\""),
    ] {
        let (key, rule) = invalid_key(&format!("{worktree}{line}\n"));
        assert_eq!(key, format!("agents.coder.{name}"), "{line}: {rule}");
    }
    match ConfigSource::from_toml_str(&format!("{worktree}keep = \"sometimes\"\n")) {
        Err(ConfigError::Load(_)) => {}
        other => panic!("an unknown keep is a load error, got {other:?}"),
    }
}
