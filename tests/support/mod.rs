//! Shared helpers of the integration tests.
#![allow(dead_code)]

pub mod admin;
pub mod cluster;
pub mod http;
pub mod metrics;
pub mod raw;
pub mod registry;
