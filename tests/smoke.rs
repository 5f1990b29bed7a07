mod common;
use common::*;
use subagentd::pb;

#[tokio::test]
async fn background_spawn_runs_and_its_result_is_readable_via_status_and_await() {
    let mut s = TestServer::start("").await;
    let a = spawn(&mut s.client, bg("acme/m1", "output hello\noutput world")).await;
    assert!(matches!(
        status(&a),
        pb::AgentStatus::Running | pb::AgentStatus::Done
    ));
    let done = await_all(&mut s.client, &[&a.id]).await;
    assert_eq!(status(&done[0]), pb::AgentStatus::Done);
    assert_eq!(done[0].result, "hello\nworld");
    let st = status_of(&mut s.client, &a.id).await;
    assert_eq!(st.result, "hello\nworld");
    assert!(st.finished_at.is_some());
    s.handle.shutdown().await.unwrap();
}
