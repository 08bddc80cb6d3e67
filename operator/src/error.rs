//! The reconciler's errors. Each variant carries the facts an operator of the operator needs, and
//! maps to one `reason` label on the failure metric.

use std::time::Duration;

/// Why a reconcile did not finish.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The spec passed schema validation but cannot be served.
    #[error("invalid spec: {0}")]
    InvalidSpec(String),
    /// A child's name is taken by an object the route does not control; applying would take it
    /// over (and deleting the route would then delete it).
    #[error("{kind} {namespace}/{name} exists and belongs to something else; rename the route or remove the {kind}")]
    NameTaken {
        kind: &'static str,
        namespace: String,
        name: String,
    },
    /// The API server answered with an error.
    #[error("{verb} {kind} {name}: {source}")]
    Api {
        verb: &'static str,
        kind: &'static str,
        name: String,
        #[source]
        source: Box<kube::Error>,
    },
    /// The API server did not answer in time.
    #[error("{verb} {kind} {name} timed out after {after:?}")]
    Timeout {
        verb: &'static str,
        kind: &'static str,
        name: String,
        after: Duration,
    },
    /// Routes are namespaced; one without a namespace is a bug in the caller.
    #[error("route has no namespace")]
    MissingNamespace,
}

impl Error {
    /// Label value of `patchbay_operator_reconcile_failures_total{reason}`.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::InvalidSpec(_) => "InvalidSpec",
            Error::NameTaken { .. } => "NameTaken",
            Error::Api { .. } => "ApiError",
            Error::Timeout { .. } => "ApiTimeout",
            Error::MissingNamespace => "MissingNamespace",
        }
    }

    /// Bad input the user must fix, as opposed to a transient failure.
    pub fn is_user_error(&self) -> bool {
        matches!(self, Error::InvalidSpec(_) | Error::NameTaken { .. })
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
