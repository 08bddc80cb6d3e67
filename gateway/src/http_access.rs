//! The access line of a request the client listener's axum router answers
//! (client secrets, calls, usage, the 400/404/405 answers): what the request was
//! is taken before the router runs, and the line is written when its
//! answer is ready, with the refusal's code the answer carries
//! ([`crate::access::RefusalCode`]). The key id is the presented key's,
//! when the keys file knows it; a client secret or an unknown key logs
//! none. WebSocket upgrades write their own lines ([`crate::server`],
//! [`crate::session`]).

use std::net::SocketAddr;

use http::Response;
use tokio::time::Instant;

use crate::access::{self, RefusalCode};
use crate::auth::presented_key;
use crate::client_secret::is_client_secret;
use crate::gateway::Gateway;

/// What an HTTP request's access line says about the request.
pub struct Request {
    method: http::Method,
    path: String,
    model: Option<String>,
    key_id: Option<String>,
    client: Option<SocketAddr>,
    started: Instant,
}

impl Request {
    /// Notes `req` as it arrives from `client`.
    pub fn of<B>(gw: &Gateway, req: &http::Request<B>, client: Option<SocketAddr>) -> Self {
        let key_id = presented_key(req.headers())
            .key
            .filter(|k| !is_client_secret(k.expose()))
            .and_then(|k| gw.keys.get().lookup(&k).map(|e| e.id.clone()));
        Self {
            method: req.method().clone(),
            path: access::logged_path(req.uri().path(), req.uri().query()),
            model: access::query_model(req.uri().query()),
            key_id,
            client,
            started: Instant::now(),
        }
    }

    /// Writes the line for `response`.
    pub fn answered<B>(&self, response: &Response<B>) {
        access::Line {
            kind: "http",
            method: self.method.as_str(),
            path: &self.path,
            status: response.status().as_u16(),
            code: response.extensions().get::<RefusalCode>().map(|c| c.0),
            outcome: None,
            key_id: self.key_id.as_deref(),
            model: self.model.as_deref(),
            client: self.client,
            duration: self.started.elapsed(),
        }
        .emit();
    }
}
