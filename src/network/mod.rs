//! The network adapter: the node's tonic services (peer RPCs for Raft, the
//! client and admin APIs, the HTTP API), the one write path (`proposer`),
//! TLS and authentication, and the server's failures named as wire reasons
//! (`status`). The wire itself — generated types, conversion, the spelling
//! of a status — is `oncekv_wire`'s; this adapter must not decide new /
//! duplicate / conflict, nor refuse a request before its entry applies
//! (rule 3).

pub mod admin_api;
pub mod auth;
pub mod client_api;
pub mod client_wire;
pub mod connections;
pub mod faults;
pub mod http_api;
pub mod leader_contact;
pub mod peer;
pub mod proposer;
pub mod status;
pub mod tls;
