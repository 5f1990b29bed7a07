//! The gRPC edge: request parsing and response building ([`convert`]), the
//! error mapping ([`status`]) and the service itself ([`service`]).

pub mod convert;
pub mod ending;
pub mod service;
pub mod status;
pub mod watch_route;
pub mod workers;
