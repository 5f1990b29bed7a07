//! What generic gRPC tools rely on: the health service and server reflection
//! in both protocol versions (grpcurl speaks v1alpha, newer tools v1).

mod common;

use common::*;
use tonic_health::pb::{
    health_check_response::ServingStatus, health_client::HealthClient, HealthCheckRequest,
};
use tonic_reflection::pb::{v1, v1alpha};

#[tokio::test]
async fn health_reports_serving_for_the_agent_service_and_not_serving_after_shutdown_begins() {
    let s = TestServer::start("").await;
    let channel = channel(&s).await;
    let mut health = HealthClient::new(channel);
    for service in ["subagents.v1.AgentService", ""] {
        let resp = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            resp.status,
            ServingStatus::Serving as i32,
            "service {service:?}"
        );
    }
    let unknown = health
        .check(HealthCheckRequest {
            service: "nope.v1.Nope".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound);

    let mut watch = health
        .watch(HealthCheckRequest {
            service: "subagents.v1.AgentService".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let first = watch.message().await.unwrap().unwrap();
    assert_eq!(first.status, ServingStatus::Serving as i32);
    let shutdown = tokio::spawn(s.handle.shutdown());
    let flipped = watch.message().await.unwrap().unwrap();
    assert_eq!(flipped.status, ServingStatus::NotServing as i32);
    drop(watch);
    shutdown.await.unwrap().unwrap();
}

#[tokio::test]
async fn reflection_v1_lists_the_api_and_serves_its_descriptor() {
    let s = TestServer::start("").await;
    let channel = channel(&s).await;
    let mut client = v1::server_reflection_client::ServerReflectionClient::new(channel);
    let requests = tokio_stream::iter(vec![
        v1::ServerReflectionRequest {
            host: String::new(),
            message_request: Some(v1::server_reflection_request::MessageRequest::ListServices(
                String::new(),
            )),
        },
        v1::ServerReflectionRequest {
            host: String::new(),
            message_request: Some(
                v1::server_reflection_request::MessageRequest::FileContainingSymbol(
                    "subagents.v1.AgentService".into(),
                ),
            ),
        },
    ]);
    let mut responses = client
        .server_reflection_info(requests)
        .await
        .unwrap()
        .into_inner();
    let listed = responses.message().await.unwrap().unwrap();
    let Some(v1::server_reflection_response::MessageResponse::ListServicesResponse(list)) =
        listed.message_response
    else {
        panic!("expected a service list, got {listed:?}");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    assert!(
        names.contains(&"subagents.v1.AgentService".to_owned()),
        "{names:?}"
    );
    assert!(
        names.contains(&"grpc.health.v1.Health".to_owned()),
        "{names:?}"
    );
    let file = responses.message().await.unwrap().unwrap();
    let Some(v1::server_reflection_response::MessageResponse::FileDescriptorResponse(fd)) =
        file.message_response
    else {
        panic!("expected a file descriptor, got {file:?}");
    };
    let decoded: Vec<prost_types::FileDescriptorProto> = fd
        .file_descriptor_proto
        .iter()
        .map(|b| prost::Message::decode(b.as_slice()).unwrap())
        .collect();
    let api = decoded
        .iter()
        .find(|f| f.package() == "subagents.v1")
        .expect("the subagents.v1 file is served");
    let methods: Vec<&str> = api.service[0].method.iter().map(|m| m.name()).collect();
    assert_eq!(
        methods,
        [
            "Spawn",
            "Status",
            "Await",
            "Cancel",
            "Steer",
            "WatchAgents",
            "Approve",
            "GetTranscript",
            "GetServerInfo"
        ]
    );
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn reflection_v1alpha_lists_the_api_for_older_tools() {
    let s = TestServer::start("").await;
    let channel = channel(&s).await;
    let mut client = v1alpha::server_reflection_client::ServerReflectionClient::new(channel);
    let requests = tokio_stream::iter(vec![v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            v1alpha::server_reflection_request::MessageRequest::ListServices(String::new()),
        ),
    }]);
    let mut responses = client
        .server_reflection_info(requests)
        .await
        .unwrap()
        .into_inner();
    let listed = responses.message().await.unwrap().unwrap();
    let Some(v1alpha::server_reflection_response::MessageResponse::ListServicesResponse(list)) =
        listed.message_response
    else {
        panic!("expected a service list, got {listed:?}");
    };
    assert!(list
        .service
        .iter()
        .any(|s| s.name == "subagents.v1.AgentService"));
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn reflection_serves_the_error_detail_types_so_tools_can_decode_them() {
    let s = TestServer::start("").await;
    let channel = channel(&s).await;
    let mut client = v1alpha::server_reflection_client::ServerReflectionClient::new(channel);
    for symbol in [
        "google.rpc.ErrorInfo",
        "google.rpc.BadRequest",
        "google.rpc.QuotaFailure",
    ] {
        let requests = tokio_stream::iter(vec![v1alpha::ServerReflectionRequest {
            host: String::new(),
            message_request: Some(
                v1alpha::server_reflection_request::MessageRequest::FileContainingSymbol(
                    symbol.into(),
                ),
            ),
        }]);
        let mut responses = client
            .server_reflection_info(requests)
            .await
            .unwrap()
            .into_inner();
        let resp = responses.message().await.unwrap().unwrap();
        assert!(
            matches!(
                resp.message_response,
                Some(
                    v1alpha::server_reflection_response::MessageResponse::FileDescriptorResponse(_)
                )
            ),
            "{symbol}: {resp:?}"
        );
    }
    s.handle.shutdown().await.unwrap();
}

async fn channel(s: &TestServer) -> tonic::transport::Channel {
    tonic::transport::Channel::from_shared(format!("http://{}", s.handle.addr()))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

#[test]
fn the_embedded_descriptor_set_decodes_and_holds_the_api() {
    let set: prost_types::FileDescriptorSet =
        prost::Message::decode(subagentd::pb::FILE_DESCRIPTOR_SET).unwrap();
    assert!(set.file.iter().any(|f| f.package() == "subagents.v1"));
}
