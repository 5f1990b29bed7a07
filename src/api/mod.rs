//! The gRPC edge: request parsing and response building ([`convert`]), the
//! error mapping ([`status`]), call deadlines ([`deadline`]) and the
//! service itself ([`service`]), and forwarding from a standby to the leader
//! ([`forward`]).

pub mod auth;
pub mod deadline;
pub mod ending;
pub mod forward;
pub mod gate;
pub mod rpc;
pub mod service;
pub mod status;
pub mod watch_route;
pub mod workers;
