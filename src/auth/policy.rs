//! The one table of which roles may call which RPC. A method missing from it
//! is refused for everyone (a test checks every served method is listed).

use super::Role::{self, Admin, Approver, Frontend, Viewer, Worker};

const READERS: &[Role] = &[Viewer, Frontend, Approver, Admin];

/// Every RPC that needs a credential, by its gRPC path, and the roles that
/// may call it. Health and reflection are not here: they need none.
pub const POLICY: &[(&str, &[Role])] = &[
    ("/subagents.v1.AgentService/Spawn", &[Frontend, Admin]),
    ("/subagents.v1.AgentService/Status", READERS),
    ("/subagents.v1.AgentService/Await", READERS),
    ("/subagents.v1.AgentService/WatchAgents", READERS),
    ("/subagents.v1.AgentService/Cancel", &[Frontend, Admin]),
    ("/subagents.v1.AgentService/Steer", &[Frontend, Admin]),
    ("/subagents.v1.AgentService/Approve", &[Approver, Admin]),
    ("/subagents.v1.AgentService/GetTranscript", READERS),
    // What the server is configured with: any authenticated caller.
    ("/subagents.v1.AgentService/GetServerInfo", &Role::ALL),
    ("/subagents.v1.WorkerService/Connect", &[Worker]),
];

/// The roles that may Await with `collect`: a collect changes what the
/// lead's next inbox Await returns, so it is a change like Cancel, not a
/// read (a viewer may Await without it).
pub const AWAIT_COLLECT: &[Role] = &[Frontend, Admin];

/// Path prefixes of the services every caller may use without a credential:
/// Kubernetes probes cannot send one, and reflection shows only the schema.
pub const OPEN_SERVICES: &[&str] = &["/grpc.health.v1.Health/", "/grpc.reflection."];

/// Whether `path` belongs to a service that needs no credential.
pub fn is_open(path: &str) -> bool {
    OPEN_SERVICES.iter().any(|prefix| path.starts_with(prefix))
}

/// The roles that may call `path`; an empty list for a method the table
/// does not know (nobody may call it).
pub fn roles_for(path: &str) -> &'static [Role] {
    POLICY
        .iter()
        .find(|(method, _)| *method == path)
        .map_or(&[], |(_, roles)| roles)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_follow_the_contract() {
        let may = |path: &str, role: Role| roles_for(path).contains(&role);
        let agent = |m: &str| format!("/subagents.v1.AgentService/{m}");
        for m in ["Status", "Await", "WatchAgents", "GetTranscript"] {
            for role in [Viewer, Frontend, Approver, Admin] {
                assert!(may(&agent(m), role), "{role:?} may {m}");
            }
            assert!(!may(&agent(m), Worker), "a worker may not {m}");
        }
        assert_eq!(AWAIT_COLLECT, &[Frontend, Admin], "a collect is a change");
        for m in ["Spawn", "Cancel", "Steer"] {
            assert!(may(&agent(m), Frontend));
            assert!(!may(&agent(m), Viewer));
            assert!(!may(&agent(m), Approver));
            assert!(!may(&agent(m), Worker));
        }
        assert!(may(&agent("Spawn"), Admin));
        assert!(may(&agent("Cancel"), Admin));
        // Operators unstick agents in any tenant with a message.
        assert!(may(&agent("Steer"), Admin));
        assert!(may(&agent("Approve"), Approver));
        assert!(may(&agent("Approve"), Admin));
        assert!(!may(&agent("Approve"), Frontend));
        let connect = "/subagents.v1.WorkerService/Connect";
        assert_eq!(roles_for(connect), &[Worker]);
        assert!(roles_for("/subagents.v1.AgentService/Nope").is_empty());
    }

    #[test]
    fn only_health_and_reflection_are_open() {
        assert!(is_open("/grpc.health.v1.Health/Check"));
        assert!(is_open("/grpc.health.v1.Health/Watch"));
        assert!(is_open(
            "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"
        ));
        assert!(is_open(
            "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
        ));
        assert!(!is_open("/subagents.v1.AgentService/Status"));
        assert!(!is_open("/grpc.health.v1.HealthX/Check"));
    }

    /// Every method the server's descriptor set declares has an entry:
    /// a new RPC cannot ship unguarded.
    #[test]
    fn every_served_method_is_in_the_table() {
        use prost::Message as _;
        let set = prost_types::FileDescriptorSet::decode(crate::pb::FILE_DESCRIPTOR_SET).unwrap();
        let mut served = Vec::new();
        for file in &set.file {
            for service in &file.service {
                for method in &service.method {
                    served.push(format!(
                        "/{}.{}/{}",
                        file.package(),
                        service.name(),
                        method.name()
                    ));
                }
            }
        }
        assert!(served.len() >= 8, "descriptor set lists {served:?}");
        for path in &served {
            assert!(
                !roles_for(path).is_empty(),
                "{path} is served but has no entry in auth::policy::POLICY"
            );
        }
        for (path, _) in POLICY {
            assert!(served.contains(&(*path).to_owned()), "{path} is not served");
        }
    }
}
