//! Test helpers of the simulator's own tests: a client connected with any
//! key, and its next event as JSON.

use std::time::Duration;

use futures_util::StreamExt;
use serde_json::Value;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use crate::handle::SimHandle;

pub(crate) type Client = WebSocketStream<TcpStream>;

/// A client of `sim` at `path_and_query`, with a Bearer key.
pub(crate) async fn connect(sim: &SimHandle, path_and_query: &str) -> Client {
    let url = format!("ws://{}{path_and_query}", sim.addr);
    let mut request = url.into_client_request().unwrap();
    request
        .headers_mut()
        .insert("authorization", "Bearer sk-any".parse().unwrap());
    let tcp = TcpStream::connect(sim.addr).await.unwrap();
    tokio_tungstenite::client_async(request, tcp)
        .await
        .unwrap()
        .0
}

/// The next text event as JSON (within 10 s); `None` at the close.
pub(crate) async fn next_json(ws: &mut Client) -> Option<Value> {
    loop {
        match tokio::time::timeout(Duration::from_secs(10), ws.next())
            .await
            .ok()??
        {
            Ok(Message::Text(t)) => return serde_json::from_str(&t).ok(),
            Ok(Message::Close(_)) | Err(_) => return None,
            Ok(_) => {}
        }
    }
}
