//! `subagentd keys new`: a fresh API key and the config entry that accepts
//! it. The key is printed once and kept nowhere: the entry holds only its
//! SHA-256 digest.

use std::io::Write as _;

use crate::auth::{self, keys, KeyConfig, Role};

/// `subagentd keys …`.
#[derive(clap::Subcommand, Debug)]
pub enum KeysCommand {
    /// Print a new API key and its `[auth.keys.KEY_ID]` entry.
    ///
    /// The key goes to the client (`SUBAGENTD_TOKEN`, or
    /// `authorization: Bearer <key>`); the entry goes into the server's
    /// config, or with --file-form into a file named KEY_ID in
    /// `[auth] keys_dir` (a Kubernetes Secret).
    New(NewArgs),
}

/// Flags of `keys new`.
#[derive(clap::Args, Debug)]
pub struct NewArgs {
    /// The tenant the key acts in.
    #[arg(long)]
    pub tenant: String,
    /// A role of the key (repeat for several): viewer, frontend, approver,
    /// worker, admin.
    #[arg(long = "role", required = true, value_parser = parse_role, value_name = "ROLE")]
    pub roles: Vec<Role>,
    /// For a worker key: an agent type it may serve (repeat for several;
    /// none = every type).
    #[arg(long = "agent-type", value_name = "NAME")]
    pub agent_types: Vec<String>,
    /// The key id (letters and digits); default: 16 random ones.
    #[arg(long)]
    pub id: Option<String>,
    /// Print the entry as a keys_dir file's contents (no table header).
    #[arg(long)]
    pub file_form: bool,
}

fn parse_role(s: &str) -> Result<Role, String> {
    Role::ALL
        .into_iter()
        .find(|r| r.name() == s)
        .ok_or_else(|| {
            format!(
                "unknown role {s:?}; roles: {}",
                auth::join(&Role::ALL).replace(',', ", ")
            )
        })
}

/// Runs a `keys` subcommand.
pub fn run(command: KeysCommand) -> anyhow::Result<()> {
    match command {
        KeysCommand::New(args) => {
            let (key, entry) = new_key(&args)?;
            let mut out = std::io::stdout().lock();
            writeln!(out, "{key}")?;
            writeln!(out)?;
            write!(out, "{entry}")?;
            Ok(())
        }
    }
}

/// The key and the TOML that accepts it.
fn new_key(args: &NewArgs) -> anyhow::Result<(String, String)> {
    let id = match &args.id {
        Some(id) => id.clone(),
        None => keys::generate_key_id()?,
    };
    let key = keys::generate(&id)?;
    let mut roles = args.roles.clone();
    roles.sort();
    roles.dedup();
    let entry = KeyConfig {
        sha256: keys::digest_hex(&keys::digest(&key)),
        tenant: args.tenant.clone(),
        roles,
        agent_types: (!args.agent_types.is_empty()).then(|| args.agent_types.clone()),
    };
    entry
        .check(&format!("auth.keys.{id}"), &id)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let body = toml::to_string(&entry)?;
    let text = if args.file_form {
        format!("# keys_dir file name: {id}\n{body}")
    } else {
        format!("[auth.keys.{id}]\n{body}")
    };
    Ok((key, text))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::Authenticator;

    fn args(roles: Vec<Role>) -> NewArgs {
        NewArgs {
            tenant: "team-a".into(),
            roles,
            agent_types: vec!["coder".into()],
            id: Some("ci1".into()),
            file_form: false,
        }
    }

    /// The printed entry, pasted into a config, accepts the printed key.
    #[test]
    fn the_entry_accepts_the_key() {
        let (key, entry) =
            new_key(&args(vec![Role::Worker, Role::Frontend, Role::Worker])).unwrap();
        assert!(key.starts_with("sa_ci1_"));
        assert!(!entry.contains(&key[7..]), "the secret is not in the entry");
        let config = crate::config::ConfigSource::from_toml_str(&format!(
            "[auth]\nmode = \"required\"\n\n{entry}"
        ))
        .expect("the entry is a valid [auth.keys.ID]")
        .auth;
        config.validate().unwrap();
        let p = Authenticator::new(&config)
            .authenticate(Some(format!("Bearer {key}").as_bytes()))
            .unwrap();
        assert_eq!(&*p.tenant, "team-a");
        assert!(p.roles.has(Role::Worker) && p.roles.has(Role::Frontend));
        assert!(p.may_serve("coder") && !p.may_serve("writer"));
    }

    #[test]
    fn a_bad_tenant_or_id_is_refused() {
        let mut a = args(vec![Role::Viewer]);
        a.tenant = "no spaces".into();
        assert!(new_key(&a).unwrap_err().to_string().contains("tenant"));
        let mut a = args(vec![Role::Viewer]);
        a.id = Some("a-b".into());
        assert!(new_key(&a).is_err());
        assert!(parse_role("root").unwrap_err().contains("viewer, frontend"));
    }
}
