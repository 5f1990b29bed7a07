//! A refused call as the lead model reads it: the reason code, what it
//! means here and what to do next. A refusal is a tool result with
//! `isError: true`, never a protocol error (hosts show protocol errors
//! opaquely, and the model could not act on them).

use std::collections::HashMap;

use tonic::Status;
use tonic_types::StatusExt;

/// The text of a refused call.
pub fn refusal_text(status: &Status) -> String {
    let details = status.get_error_details();
    let (reason, meta): (String, HashMap<String, String>) = match details.error_info() {
        Some(info) => (info.reason.clone(), info.metadata.clone()),
        None => (
            format!("{:?}", status.code()).to_uppercase(),
            HashMap::new(),
        ),
    };
    let get = |key: &str| meta.get(key).map_or("?", String::as_str);
    let next = match reason.as_str() {
        "GLOBAL_LIMIT_REACHED" => format!(
            "{} of {} background agents are live ({}). Wait with agent_await, or cancel one.",
            get("live"),
            get("limit"),
            meta.get("config_key")
                .map_or("limits.max_background_agents", String::as_str)
        ),
        "DESCENDANT_LIMIT_REACHED" => format!(
            "the tree of {} already has {} of {} live agents. Wait with agent_await, or cancel one.",
            get("root_id"),
            get("live"),
            get("limit")
        ),
        "DEPTH_LIMIT_REACHED" => format!(
            "agents may nest at most {} deep; this one would be at depth {}. Do the work yourself, \
             or ask your parent to spawn it.",
            get("limit"),
            get("depth")
        ),
        "UNKNOWN_AGENT_TYPE" => format!(
            "there is no agent type \"{}\". Known types: {}.",
            get("agent"),
            get("known")
        ),
        "AGENT_NOT_FOUND" => format!(
            "no agent {} (it may be older than the retention period). Check the id with \
             agent_status.",
            get("id")
        ),
        "AGENT_FINISHED" => format!(
            "agent {} has finished ({}). To give it more work, use agent_spawn with \
             continue_from: \"{}\".",
            get("id"),
            super::render::status_word_of_name(get("status")),
            get("id")
        ),
        "AGENT_BUSY" => format!(
            "agent {} is still {}: it can be continued once it has finished. Wait for it with \
             agent_await.",
            get("id"),
            super::render::status_word_of_name(get("status"))
        ),
        "NOT_LATEST" => format!(
            "agent {} was already continued; continue the latest turn, {}, instead (or set fork: \
             true to branch from {}).",
            get("id"),
            get("latest_id"),
            get("id")
        ),
        "NOT_RESUMABLE" => format!(
            "agents of type {} cannot be continued; start a new one with agent_spawn.",
            get("agent")
        ),
        "CONVERSATION_EXPIRED" => format!(
            "the conversation of {} is no longer kept; start a new agent with agent_spawn and \
             give it what it needs in the prompt.",
            get("id")
        ),
        "NOT_AWAITING_APPROVAL" => format!(
            "agent {} has no pending approval (it is {}).",
            get("id"),
            super::render::status_word_of_name(get("status"))
        ),
        "APPROVAL_MISMATCH" => format!(
            "agent {}'s pending approval is {}, not {}.",
            get("id"),
            get("pending_approval_id"),
            get("approval_id")
        ),
        "PERMISSION_DENIED" => format!(
            "this credential may not do that: {}. Ask whoever runs subagentd for a key with \
             the role.",
            status.message()
        ),
        "INVALID_REQUEST" => {
            let violations: Vec<String> = details
                .bad_request()
                .map(|b| {
                    b.field_violations
                        .iter()
                        .map(|v| format!("{}: {}", v.field, v.description))
                        .collect()
                })
                .unwrap_or_default();
            if violations.is_empty() {
                status.message().to_owned()
            } else {
                format!("fix the arguments: {}.", violations.join("; "))
            }
        }
        "NO_LEADER" | "RECOVERING" | "SHUTTING_DOWN" | "STORE_FAILED" => format!(
            "the service is not available right now ({}); try again in a moment.",
            status.message()
        ),
        _ => status.message().to_owned(),
    };
    format!("Refused ({reason}): {next}")
}

#[cfg(test)]
mod tests {
    use tonic::Code;
    use tonic_types::{ErrorDetails, StatusExt};

    use super::*;

    fn status(code: Code, reason: &str, meta: &[(&str, &str)]) -> Status {
        let details = ErrorDetails::with_error_info(
            reason,
            "subagentd",
            meta.iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect::<HashMap<_, _>>(),
        );
        Status::with_error_details(code, "refused", details)
    }

    #[test]
    fn the_global_cap_says_how_many_and_what_to_do() {
        let s = status(
            Code::ResourceExhausted,
            "GLOBAL_LIMIT_REACHED",
            &[
                ("limit", "5"),
                ("live", "5"),
                ("config_key", "limits.max_background_agents"),
            ],
        );
        assert_eq!(
            refusal_text(&s),
            "Refused (GLOBAL_LIMIT_REACHED): 5 of 5 background agents are live \
             (limits.max_background_agents). Wait with agent_await, or cancel one."
        );
    }

    #[test]
    fn not_latest_names_the_latest_turn() {
        let s = status(
            Code::FailedPrecondition,
            "NOT_LATEST",
            &[("id", "a"), ("latest_id", "b")],
        );
        assert!(refusal_text(&s).contains("continue the latest turn, b, instead"));
    }

    #[test]
    fn a_status_without_error_info_names_its_code() {
        let s = Status::unavailable("connection refused");
        assert_eq!(
            refusal_text(&s),
            "Refused (UNAVAILABLE): connection refused"
        );
    }
}
