//! Redis URLs: one server (`redis://`, `rediss://`, `unix://`), a Redis
//! Cluster (`redis[s]+cluster://[user:password@]host:port,host:port,…`) or
//! a primary watched by Sentinel
//! (`redis[s]+sentinel://[user:password@]host:port,…/<primary name>`,
//! optionally `?sentinel_username=…&sentinel_password=…` for sentinels
//! that require a login). Parsed here, checked for the config, and printed
//! without credentials.

use url::Url;

/// Which topology a URL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topology {
    Single,
    Cluster,
    Sentinel,
}

/// A Redis URL taken apart: its topology, TLS, credentials, nodes and (for
/// Sentinel) the primary's name.
#[derive(Clone, PartialEq, Eq)]
pub struct ParsedUrl {
    pub topology: Topology,
    pub tls: bool,
    /// `user:password@` as written (empty when none).
    userinfo: String,
    /// `host:port` of each node (cluster seeds, sentinels); empty for one server.
    pub nodes: Vec<String>,
    /// Sentinel: the primary's name.
    pub master: String,
    sentinel_userinfo: String,
}

impl std::fmt::Debug for ParsedUrl {
    // Credentials stay out of every printout.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParsedUrl")
            .field("topology", &self.topology)
            .field("tls", &self.tls)
            .field("nodes", &self.nodes)
            .field("master", &self.master)
            .finish_non_exhaustive()
    }
}

/// Parses `url` into its topology; a one-server URL is left to redis-rs.
pub fn parse(url: &str) -> Result<ParsedUrl, String> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| "not a URL (no scheme://)".to_string())?;
    let (topology, tls) = match scheme {
        "redis" | "unix" => (Topology::Single, false),
        "rediss" => (Topology::Single, true),
        "redis+cluster" => (Topology::Cluster, false),
        "rediss+cluster" => (Topology::Cluster, true),
        "redis+sentinel" => (Topology::Sentinel, false),
        "rediss+sentinel" => (Topology::Sentinel, true),
        other => return Err(format!("unknown scheme {other}://")),
    };
    let single = ParsedUrl {
        topology,
        tls,
        userinfo: String::new(),
        nodes: Vec::new(),
        master: String::new(),
        sentinel_userinfo: String::new(),
    };
    if topology == Topology::Single {
        return Ok(single);
    }
    if rest.contains('#') {
        return Err("a URL fragment is not accepted".into());
    }
    let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let (userinfo, hosts) = match authority.rsplit_once('@') {
        Some((u, h)) => (format!("{u}@"), h),
        None => (String::new(), authority),
    };
    let mut nodes = Vec::new();
    for h in hosts.split(',') {
        // Not quoted: a misplaced password may stand where a node should.
        let bad = || format!("node {} of the list is not host:port", nodes.len() + 1);
        let (host, port) = h.rsplit_once(':').ok_or_else(bad)?;
        if host.is_empty() || port.parse::<u16>().map_or(true, |p| p == 0) {
            return Err(bad());
        }
        nodes.push(h.to_string());
    }
    let master = path.trim_end_matches('/').to_string();
    let mut sentinel_user = String::new();
    let mut sentinel_password = String::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("sentinel_username", v)) if topology == Topology::Sentinel => {
                sentinel_user = v.to_string()
            }
            Some(("sentinel_password", v)) if topology == Topology::Sentinel => {
                sentinel_password = v.to_string()
            }
            _ => {
                let name = pair.split('=').next().unwrap_or(pair);
                return Err(format!("unknown query parameter {name:?}"));
            }
        }
    }
    match topology {
        Topology::Sentinel if master.is_empty() || master.contains('/') => {
            return Err("a Sentinel URL ends with /<primary name>".into())
        }
        Topology::Cluster if !master.is_empty() => {
            return Err("a cluster URL has no path (clusters have one database)".into())
        }
        _ => {}
    }
    let sentinel_userinfo = if sentinel_user.is_empty() && sentinel_password.is_empty() {
        String::new()
    } else {
        format!("{sentinel_user}:{sentinel_password}@")
    };
    Ok(ParsedUrl {
        userinfo,
        nodes,
        master,
        sentinel_userinfo,
        ..single
    })
}

impl ParsedUrl {
    pub fn node_url(&self, node: &str) -> String {
        let scheme = if self.tls { "rediss" } else { "redis" };
        format!("{scheme}://{}{node}", self.userinfo)
    }

    pub fn sentinel_url(&self, node: &str) -> String {
        let scheme = if self.tls { "rediss" } else { "redis" };
        format!("{scheme}://{}{node}", self.sentinel_userinfo)
    }
}

/// `scheme://host:port` of a Redis URL (every node of a cluster or a
/// Sentinel set, and the primary's name), without user or password.
pub fn endpoint(url: &str) -> String {
    if let Ok(p) = parse(url) {
        if p.topology != Topology::Single {
            let scheme = url.split("://").next().unwrap_or_default();
            let nodes = p.nodes.join(",");
            return match p.topology {
                Topology::Sentinel => format!("{scheme}://{nodes}/{}", p.master),
                _ => format!("{scheme}://{nodes}"),
            };
        }
    }
    match Url::parse(url) {
        Ok(u) => format!(
            "{}://{}:{}",
            u.scheme(),
            u.host_str().unwrap_or(""),
            u.port().unwrap_or(6379)
        ),
        Err(_) => "redis (unparsable URL)".into(),
    }
}

/// A store URL the gateway can use safely: a known scheme, nodes as
/// `host:port`, TLS certificates always verified (redis-rs's `#insecure`
/// fragment is refused), and a `ca_file` only with TLS. The error never
/// quotes the URL (it may hold a password).
pub fn check(url: &str, has_ca_file: bool) -> Result<(), String> {
    let parsed = parse(url).map_err(|m| {
        if m.starts_with("unknown scheme") || m.starts_with("not a URL") {
            "must hold a redis://, rediss://, unix://, redis+cluster://, rediss+cluster://, \
             redis+sentinel:// or rediss+sentinel:// URL"
                .to_string()
        } else {
            m
        }
    })?;
    if parsed.topology == Topology::Single {
        let u = Url::parse(url).map_err(|e| format!("not a valid URL: {e}"))?;
        if u.fragment().is_some() {
            return Err("a URL fragment (such as #insecure) is not accepted: TLS certificates are always verified".into());
        }
    }
    if has_ca_file && !parsed.tls {
        return Err("store.ca_file is set, so the URL must use TLS (rediss://, rediss+cluster:// or rediss+sentinel://)".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_and_sentinel_urls_name_their_nodes_and_keep_credentials_out_of_the_endpoint() {
        let c = parse("rediss+cluster://u:p%40ss@10.0.0.1:7000,10.0.0.2:7001").unwrap();
        assert_eq!(c.topology, Topology::Cluster);
        assert!(c.tls);
        assert_eq!(c.nodes, ["10.0.0.1:7000", "10.0.0.2:7001"]);
        assert_eq!(
            c.node_url("10.0.0.2:7001"),
            "rediss://u:p%40ss@10.0.0.2:7001"
        );
        assert_eq!(
            endpoint("rediss+cluster://u:p%40ss@10.0.0.1:7000,10.0.0.2:7001"),
            "rediss+cluster://10.0.0.1:7000,10.0.0.2:7001"
        );
        assert!(!format!("{c:?}").contains("p%40ss"));

        let s =
            parse("redis+sentinel://:pw@s1:26379,s2:26379/mymaster?sentinel_password=sp").unwrap();
        assert_eq!(s.topology, Topology::Sentinel);
        assert_eq!(s.master, "mymaster");
        assert_eq!(s.node_url("10.1.1.1:6379"), "redis://:pw@10.1.1.1:6379");
        assert_eq!(s.sentinel_url("s1:26379"), "redis://:sp@s1:26379");
        assert_eq!(
            endpoint("redis+sentinel://:pw@s1:26379,s2:26379/mymaster"),
            "redis+sentinel://s1:26379,s2:26379/mymaster"
        );
        // Without sentinel credentials the sentinels get none.
        let s = parse("redis+sentinel://:pw@s1:26379/m").unwrap();
        assert_eq!(s.sentinel_url("s1:26379"), "redis://s1:26379");
    }

    #[test]
    fn malformed_topology_urls_are_refused_with_the_reason() {
        for (url, why) in [
            ("redis+sentinel://s1:26379", "ends with /<primary name>"),
            ("redis+sentinel://s1:26379/", "ends with /<primary name>"),
            ("redis+cluster://h1:7000/0", "no path"),
            ("redis+cluster://h1", "host:port"),
            ("redis+cluster://h1:0", "host:port"),
            ("redis+cluster://h1:7000,", "host:port"),
            ("redis+cluster://h1:7000#insecure", "fragment"),
            ("redis+cluster://h1:7000?x=1", "unknown query parameter"),
            (
                "redis+sentinel://s1:1/m?sentinel_pass=1",
                "unknown query parameter",
            ),
            ("memcached://h1:1", "unknown scheme"),
        ] {
            let e = parse(url).unwrap_err();
            assert!(e.contains(why), "{url}: {e}");
        }
    }

    #[test]
    fn the_config_takes_every_topology_and_keeps_tls_rules_and_secrets() {
        for url in [
            "redis://h:6379",
            "rediss://u:p@h:6380/0",
            "redis+cluster://h1:7000,h2:7001",
            "rediss+sentinel://:pw@s1:26379/m",
        ] {
            assert_eq!(check(url, false), Ok(()), "{url}");
        }
        assert!(check("rediss+cluster://h1:7000", true).is_ok());
        for (url, ca, why) in [
            ("redis+cluster://h1:7000", true, "must use TLS"),
            ("redis://h:1", true, "must use TLS"),
            ("rediss://h:1#insecure", false, "fragment"),
            ("http://secret@h:1", false, "must hold a redis://"),
            ("redis+sentinel://:hunter2@s1:1", false, "primary name"),
            ("redis+cluster://h1:1,:hunter2", false, "node 2 of the list"),
        ] {
            let e = check(url, ca).unwrap_err();
            assert!(e.contains(why), "{url}: {e}");
            assert!(!e.contains("hunter2") && !e.contains("secret@"), "{e}");
        }
    }
}
