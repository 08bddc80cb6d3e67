//! A byte-copying TCP relay: the least any one-hop proxy can add.
//!
//! Each accepted connection gets a fresh connection to the upstream and
//! bytes are copied both ways (`TCP_NODELAY` on both legs, no parsing, no
//! buffering beyond one read) until either side closes. Put in front of the
//! simulator as a bench target (`tcp-relay`, run by `run.sh`), the gap
//! between it and a direct connection is the cost of the extra hop itself
//! (two more loopback sends and two more process wake-ups per message),
//! which a gateway cannot avoid either; the gap between it and the gateway
//! is what the gateway's own work adds.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};

/// Serves `listener` forever, relaying every connection to `upstream`.
pub async fn serve(listener: TcpListener, upstream: SocketAddr) {
    loop {
        let mut client = match listener.accept().await {
            Ok((c, _)) => c,
            // Out of descriptors, or a connection reset before accept: keep
            // serving the others after a breath.
            Err(e) => {
                eprintln!("tcp-relay: accept: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        tokio::spawn(async move {
            // A refused upstream connection drops the client, as a real
            // proxy without a listener behind it would.
            let Ok(mut up) = TcpStream::connect(upstream).await else {
                return;
            };
            if client.set_nodelay(true).is_err() || up.set_nodelay(true).is_err() {
                return;
            }
            // Either side closing or failing ends both.
            let _ = tokio::io::copy_bidirectional(&mut client, &mut up).await;
        });
    }
}
