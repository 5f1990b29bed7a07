//! The one place domain errors become gRPC statuses.
//!
//! Every status carries a `google.rpc.ErrorInfo` in domain [`DOMAIN`] whose
//! reason is one of the `REASON_*` constants, so clients branch on the
//! reason, never on message text.

use std::collections::HashMap;

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use crate::scheduler::Error;

/// ErrorInfo domain of every error.
pub const DOMAIN: &str = "subagentd";
/// A request field is malformed (with BadRequest field violations).
pub const REASON_INVALID_REQUEST: &str = "INVALID_REQUEST";
/// The agent type is not configured.
pub const REASON_UNKNOWN_AGENT_TYPE: &str = "UNKNOWN_AGENT_TYPE";
/// No such agent.
pub const REASON_AGENT_NOT_FOUND: &str = "AGENT_NOT_FOUND";
/// The agent already ended.
pub const REASON_AGENT_FINISHED: &str = "AGENT_FINISHED";
/// `continue_from` names a live agent.
pub const REASON_AGENT_BUSY: &str = "AGENT_BUSY";
/// `continue_from` names an agent that is not its conversation's latest.
pub const REASON_NOT_LATEST: &str = "NOT_LATEST";
/// The transcript is no longer retained.
pub const REASON_CONVERSATION_EXPIRED: &str = "CONVERSATION_EXPIRED";
/// The agent type sets `continuable = false`.
pub const REASON_NOT_RESUMABLE: &str = "NOT_RESUMABLE";
/// `max_background_agents` reached.
pub const REASON_GLOBAL_LIMIT_REACHED: &str = "GLOBAL_LIMIT_REACHED";
/// A tenant's `[tenants.NAME] max_background_agents` reached.
pub const REASON_TENANT_LIMIT_REACHED: &str = "TENANT_LIMIT_REACHED";
/// A tenant's `[tenants.NAME] spawn_rate` passed.
pub const REASON_RATE_LIMITED: &str = "RATE_LIMITED";
/// A tenant's `[limits] max_watchers_per_tenant` reached.
pub const REASON_WATCH_LIMIT_REACHED: &str = "WATCH_LIMIT_REACHED";
/// `max_depth` reached.
pub const REASON_DEPTH_LIMIT_REACHED: &str = "DEPTH_LIMIT_REACHED";
/// `max_live_descendants_per_root` reached.
pub const REASON_DESCENDANT_LIMIT_REACHED: &str = "DESCENDANT_LIMIT_REACHED";
/// The server is shutting down.
pub const REASON_SHUTTING_DOWN: &str = "SHUTTING_DOWN";
/// A change could not be made durable.
pub const REASON_STORE_FAILED: &str = "STORE_FAILED";
/// The server is recovering its state at start.
pub const REASON_RECOVERING: &str = "RECOVERING";
/// A standby knows no reachable leader to forward to.
pub const REASON_NO_LEADER: &str = "NO_LEADER";
/// Steer to an agent whose type takes no steer messages.
pub const REASON_STEER_NOT_ACCEPTED: &str = "STEER_NOT_ACCEPTED";
/// Approve for an agent with no pending approval.
pub const REASON_NOT_AWAITING_APPROVAL: &str = "NOT_AWAITING_APPROVAL";
/// Approve naming an approval other than the pending one.
pub const REASON_APPROVAL_MISMATCH: &str = "APPROVAL_MISMATCH";
/// A WatchAgents subscriber fell behind its buffer.
pub const REASON_WATCH_LAGGED: &str = "WATCH_LAGGED";
/// No credential or a bad one (metadata `cause`).
pub const REASON_UNAUTHENTICATED: &str = "UNAUTHENTICATED";
/// The caller's roles do not allow the call (metadata `required_roles`).
pub const REASON_PERMISSION_DENIED: &str = "PERMISSION_DENIED";

fn info(details: &mut ErrorDetails, reason: &str, metadata: &[(&str, String)]) {
    let metadata: HashMap<String, String> = metadata
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.clone()))
        .collect();
    details.set_error_info(reason, DOMAIN, metadata);
}

/// The ErrorInfo reason of `err` (also the `reason` label of the
/// rejected-spawn metric).
pub fn reason_of(err: &Error) -> &'static str {
    match err {
        Error::Invalid(_) => REASON_INVALID_REQUEST,
        Error::UnknownAgentType { .. } => REASON_UNKNOWN_AGENT_TYPE,
        Error::NotFound { .. } => REASON_AGENT_NOT_FOUND,
        Error::AgentFinished { .. } => REASON_AGENT_FINISHED,
        Error::AgentBusy { .. } => REASON_AGENT_BUSY,
        Error::NotLatest { .. } => REASON_NOT_LATEST,
        Error::ConversationExpired { .. } => REASON_CONVERSATION_EXPIRED,
        Error::NotResumable { .. } => REASON_NOT_RESUMABLE,
        Error::GlobalLimit { .. } => REASON_GLOBAL_LIMIT_REACHED,
        Error::TenantLimit { .. } => REASON_TENANT_LIMIT_REACHED,
        Error::RateLimited { .. } => REASON_RATE_LIMITED,
        Error::WatchLimit { .. } => REASON_WATCH_LIMIT_REACHED,
        Error::DepthLimit { .. } => REASON_DEPTH_LIMIT_REACHED,
        Error::DescendantLimit { .. } => REASON_DESCENDANT_LIMIT_REACHED,
        Error::ShuttingDown => REASON_SHUTTING_DOWN,
        Error::StoreFailed => REASON_STORE_FAILED,
        Error::Recovering | Error::AwaitingReattach { .. } => REASON_RECOVERING,
        Error::NoLeader { .. } => REASON_NO_LEADER,
        Error::SteerNotAccepted { .. } => REASON_STEER_NOT_ACCEPTED,
        Error::NotAwaitingApproval { .. } => REASON_NOT_AWAITING_APPROVAL,
        Error::ApprovalMismatch { .. } => REASON_APPROVAL_MISMATCH,
    }
}

impl From<Error> for Status {
    fn from(err: Error) -> Self {
        let message = err.to_string();
        let mut d = ErrorDetails::new();
        let code = match &err {
            Error::Invalid(violations) => {
                info(&mut d, REASON_INVALID_REQUEST, &[]);
                for v in violations {
                    d.add_bad_request_violation(v.field.clone(), v.description.clone());
                }
                Code::InvalidArgument
            }
            Error::UnknownAgentType { name, known } => {
                info(
                    &mut d,
                    REASON_UNKNOWN_AGENT_TYPE,
                    &[("agent", name.clone()), ("known", known.join(","))],
                );
                d.add_bad_request_violation(
                    "agent",
                    format!("unknown agent type; known: {}", known.join(", ")),
                );
                Code::InvalidArgument
            }
            Error::NotFound { field, id } => {
                info(
                    &mut d,
                    REASON_AGENT_NOT_FOUND,
                    &[("id", id.clone()), ("field", (*field).to_owned())],
                );
                d.set_resource_info("agent", id.clone(), "", "no agent with this id is retained");
                Code::NotFound
            }
            Error::AgentFinished { field, id, status } => {
                info(
                    &mut d,
                    REASON_AGENT_FINISHED,
                    &[
                        ("id", id.clone()),
                        ("field", (*field).to_owned()),
                        (
                            "status",
                            crate::wire::status_to_pb(*status).as_str_name().to_owned(),
                        ),
                    ],
                );
                d.add_precondition_failure_violation(
                    "AGENT_FINISHED",
                    id.clone(),
                    "the agent has already ended",
                );
                Code::FailedPrecondition
            }
            Error::AgentBusy { id, status } => {
                let status = crate::wire::status_to_pb(*status).as_str_name();
                info(
                    &mut d,
                    REASON_AGENT_BUSY,
                    &[("id", id.to_string()), ("status", status.to_owned())],
                );
                d.add_precondition_failure_violation(
                    "AGENT_BUSY",
                    id.to_string(),
                    "the agent is still live: Steer, Approve or Await it",
                );
                Code::FailedPrecondition
            }
            Error::NotLatest {
                id,
                conversation_id,
                latest,
            } => {
                info(
                    &mut d,
                    REASON_NOT_LATEST,
                    &[
                        ("id", id.to_string()),
                        ("conversation_id", conversation_id.to_string()),
                        ("latest_id", latest.to_string()),
                    ],
                );
                d.add_precondition_failure_violation(
                    "NOT_LATEST",
                    id.to_string(),
                    format!("a later agent continued the conversation; its latest is {latest}"),
                );
                Code::FailedPrecondition
            }
            Error::ConversationExpired { field, id } => {
                info(
                    &mut d,
                    REASON_CONVERSATION_EXPIRED,
                    &[("id", id.to_string()), ("field", (*field).to_owned())],
                );
                d.set_resource_info(
                    "conversation",
                    id.to_string(),
                    "",
                    "its transcript is no longer retained",
                );
                Code::NotFound
            }
            Error::NotResumable { id, agent_type } => {
                info(
                    &mut d,
                    REASON_NOT_RESUMABLE,
                    &[("id", id.to_string()), ("agent", agent_type.clone())],
                );
                d.add_precondition_failure_violation(
                    "NOT_RESUMABLE",
                    format!("agents.{agent_type}.continuable"),
                    "the agent type takes no history",
                );
                Code::FailedPrecondition
            }
            Error::GlobalLimit { limit, live } => {
                info(
                    &mut d,
                    REASON_GLOBAL_LIMIT_REACHED,
                    &[
                        ("limit", limit.to_string()),
                        ("live", live.to_string()),
                        ("config_key", "limits.max_background_agents".to_owned()),
                    ],
                );
                d.add_quota_failure_violation(
                    "limits.max_background_agents",
                    format!("{live} of {limit} live background agents"),
                );
                Code::ResourceExhausted
            }
            Error::TenantLimit {
                tenant,
                limit,
                live,
            } => {
                let config_key = format!("tenants.{tenant}.max_background_agents");
                info(
                    &mut d,
                    REASON_TENANT_LIMIT_REACHED,
                    &[
                        ("tenant", tenant.to_string()),
                        ("limit", limit.to_string()),
                        ("live", live.to_string()),
                        ("config_key", config_key.clone()),
                    ],
                );
                d.add_quota_failure_violation(
                    config_key,
                    format!("{live} of {limit} live background agents of tenant {tenant}"),
                );
                Code::ResourceExhausted
            }
            Error::RateLimited {
                tenant,
                rate,
                burst,
                retry_after,
            } => {
                info(
                    &mut d,
                    REASON_RATE_LIMITED,
                    &[
                        ("tenant", tenant.to_string()),
                        ("spawn_rate", rate.clone()),
                        ("spawn_burst", burst.to_string()),
                        ("config_key", format!("tenants.{tenant}.spawn_rate")),
                    ],
                );
                d.set_retry_info(Some(*retry_after));
                Code::ResourceExhausted
            }
            Error::WatchLimit {
                tenant,
                limit,
                open,
            } => {
                info(
                    &mut d,
                    REASON_WATCH_LIMIT_REACHED,
                    &[
                        ("tenant", tenant.to_string()),
                        ("limit", limit.to_string()),
                        ("open", open.to_string()),
                        ("config_key", "limits.max_watchers_per_tenant".to_owned()),
                    ],
                );
                d.add_quota_failure_violation(
                    "limits.max_watchers_per_tenant",
                    format!("{open} of {limit} open WatchAgents streams of tenant {tenant}"),
                );
                Code::ResourceExhausted
            }
            Error::DepthLimit { limit, depth } => {
                info(
                    &mut d,
                    REASON_DEPTH_LIMIT_REACHED,
                    &[
                        ("limit", limit.to_string()),
                        ("depth", depth.to_string()),
                        ("config_key", "limits.max_depth".to_owned()),
                    ],
                );
                d.add_precondition_failure_violation(
                    "DEPTH_LIMIT_REACHED",
                    "limits.max_depth",
                    format!("depth {depth} exceeds max_depth {limit}"),
                );
                Code::FailedPrecondition
            }
            Error::DescendantLimit {
                limit,
                live,
                root_id,
            } => {
                info(
                    &mut d,
                    REASON_DESCENDANT_LIMIT_REACHED,
                    &[
                        ("limit", limit.to_string()),
                        ("live", live.to_string()),
                        ("root_id", root_id.to_string()),
                        (
                            "config_key",
                            "limits.max_live_descendants_per_root".to_owned(),
                        ),
                    ],
                );
                d.add_quota_failure_violation(
                    format!("tree {root_id}"),
                    format!("{live} of {limit} live agents in the tree"),
                );
                Code::ResourceExhausted
            }
            Error::ShuttingDown => {
                info(&mut d, REASON_SHUTTING_DOWN, &[]);
                Code::Unavailable
            }
            Error::StoreFailed => {
                info(&mut d, REASON_STORE_FAILED, &[]);
                Code::Unavailable
            }
            Error::Recovering => {
                info(&mut d, REASON_RECOVERING, &[]);
                Code::Unavailable
            }
            Error::NoLeader { .. } => {
                info(&mut d, REASON_NO_LEADER, &[]);
                Code::Unavailable
            }
            Error::AwaitingReattach { id } => {
                info(&mut d, REASON_RECOVERING, &[("agent_id", id.to_string())]);
                Code::Unavailable
            }
            Error::SteerNotAccepted { id, agent_type } => {
                info(
                    &mut d,
                    REASON_STEER_NOT_ACCEPTED,
                    &[("id", id.to_string()), ("agent", agent_type.clone())],
                );
                d.add_precondition_failure_violation(
                    "STEER_NOT_ACCEPTED",
                    format!("agents.{agent_type}.steer"),
                    "the agent type does not accept steering",
                );
                Code::FailedPrecondition
            }
            Error::NotAwaitingApproval { id, status } => {
                let status = crate::wire::status_to_pb(*status).as_str_name();
                info(
                    &mut d,
                    REASON_NOT_AWAITING_APPROVAL,
                    &[("id", id.to_string()), ("status", status.to_owned())],
                );
                d.add_precondition_failure_violation(
                    "NOT_AWAITING_APPROVAL",
                    id.to_string(),
                    format!("the agent is {status}, not AGENT_STATUS_AWAITING_APPROVAL"),
                );
                Code::FailedPrecondition
            }
            Error::ApprovalMismatch { id, given, pending } => {
                info(
                    &mut d,
                    REASON_APPROVAL_MISMATCH,
                    &[
                        ("id", id.to_string()),
                        ("approval_id", given.to_string()),
                        ("pending_approval_id", pending.to_string()),
                    ],
                );
                d.add_precondition_failure_violation(
                    "APPROVAL_MISMATCH",
                    format!("{id}/{given}"),
                    "not the agent's pending approval",
                );
                Code::FailedPrecondition
            }
        };
        Status::with_error_details(code, message, d)
    }
}

impl From<crate::auth::AuthError> for Status {
    fn from(err: crate::auth::AuthError) -> Self {
        use crate::auth::AuthError;
        let message = err.to_string();
        let mut d = ErrorDetails::new();
        let code = match &err {
            AuthError::Unauthenticated(cause) => {
                info(
                    &mut d,
                    REASON_UNAUTHENTICATED,
                    &[("cause", cause.name().to_owned())],
                );
                Code::Unauthenticated
            }
            AuthError::UnknownSigningKey => {
                info(
                    &mut d,
                    REASON_UNAUTHENTICATED,
                    &[("cause", crate::auth::Cause::Unknown.name().to_owned())],
                );
                Code::Unauthenticated
            }
            AuthError::TenantNotGranted { granted, .. } => {
                info(
                    &mut d,
                    REASON_PERMISSION_DENIED,
                    &[
                        ("granted_tenants", granted.join(",")),
                        ("header", crate::auth::jwt::TENANT_HEADER.to_owned()),
                    ],
                );
                Code::PermissionDenied
            }
            AuthError::PermissionDenied { method, required } => {
                info(
                    &mut d,
                    REASON_PERMISSION_DENIED,
                    &[
                        ("method", method.clone()),
                        ("required_roles", crate::auth::join(required)),
                    ],
                );
                Code::PermissionDenied
            }
            AuthError::AgentTypesDenied { types } => {
                info(
                    &mut d,
                    REASON_PERMISSION_DENIED,
                    &[
                        ("agent_types", types.join(",")),
                        (
                            "required_roles",
                            crate::auth::Role::Worker.name().to_owned(),
                        ),
                    ],
                );
                Code::PermissionDenied
            }
        };
        Status::with_error_details(code, message, d)
    }
}

/// The status that ends a WatchAgents stream whose subscriber fell behind.
pub fn watch_lagged(missed: u64, resume_after: u64) -> Status {
    let mut d = ErrorDetails::new();
    info(
        &mut d,
        REASON_WATCH_LAGGED,
        &[
            ("missed_events", missed.to_string()),
            ("resume_after_sequence", resume_after.to_string()),
        ],
    );
    Status::with_error_details(
        Code::ResourceExhausted,
        format!(
            "watch subscriber fell behind by {missed} events and was cut off; \
             resubscribe with after_sequence={resume_after} to resume"
        ),
        d,
    )
}

/// A message in a request stream that tonic could not decode is the
/// client's fault: INVALID_ARGUMENT, not the INTERNAL tonic answers (which
/// tells a client the server broke). Other statuses pass unchanged.
pub fn undecodable_is_invalid(status: Status) -> Status {
    if status.code() == Code::Internal && status.message().starts_with("failed to decode") {
        Status::invalid_argument(status.message().to_owned())
    } else {
        status
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic_types::StatusExt;

    #[test]
    fn store_errors_are_unavailable_with_their_reason() {
        for (err, reason) in [
            (Error::StoreFailed, REASON_STORE_FAILED),
            (Error::Recovering, REASON_RECOVERING),
            (
                Error::NoLeader {
                    why: "election in progress".into(),
                },
                REASON_NO_LEADER,
            ),
            (
                Error::AwaitingReattach {
                    id: uuid::Uuid::nil(),
                },
                REASON_RECOVERING,
            ),
        ] {
            let status = Status::from(err);
            assert_eq!(status.code(), Code::Unavailable);
            let info = status.get_details_error_info().expect("ErrorInfo");
            assert_eq!(info.reason, reason);
            assert_eq!(info.domain, DOMAIN);
        }
    }
}
