//! Patchbay operator: reconciles `RealtimeRoute` resources (`patchbay.dev/v1alpha1`) into gateway
//! Deployments with their ConfigMaps, Service, autoscaler and disruption budget.
//!
//! Layout, in reconcile order: [`crd`] (the resource), [`validate`], [`build`] (pure builders,
//! with [`gateway_config`] and [`pool`]), [`apply`] (server-side apply), [`exposure`] (the Gateway API `HTTPRoute`), [`status`], [`events`];
//! [`controller`] wires them to the watches; [`render`] runs the same stages on a file, offline. [`leader`] is the Lease-based leader election,
//! [`metrics`] and [`http`] the operator's own `/metrics` and `/healthz`. [`deletion_cost`] keeps
//! each gateway pod's deletion cost at its live sessions, so scale-down spares busy pods; from the
//! same scrapes [`live_status`] writes each route's live figures into its status.

pub mod apply;
pub mod build;
pub mod context;
pub mod controller;
pub mod crd;
pub mod deletion_cost;
pub mod error;
pub mod events;
pub mod exposure;
pub mod gateway_config;
pub mod http;
pub mod leader;
pub mod live_status;
pub mod metrics;
pub mod ownership;
pub mod pods;
pub mod pool;
pub mod render;
pub mod status;
pub mod validate;

#[cfg(test)]
mod fixtures;
#[cfg(test)]
mod reconcile_tests;

pub use context::Context;
pub use crd::{RealtimeRoute, RealtimeRouteSpec, RealtimeRouteStatus};
pub use error::Error;
