//! `patchbay-gateway keys new --id ID [--team T]`: a new random client key,
//! printed once (stdout's first line), and the `[[keys]]` block to add to
//! the keys file. Only
//! the key's SHA-256 goes in the file (docs/configuration.md); the key
//! itself is not kept anywhere.

use std::process::ExitCode;

use patchbay_gateway::secret::Secret;

/// The prefix of a Patchbay client key (a client secret is `pbek_…`).
const KEY_PREFIX: &str = "pb-";
/// Random bytes in a key (hex-encoded after the prefix).
const KEY_BYTES: usize = 24;

pub fn new(id: &str, team: Option<&str>) -> ExitCode {
    if id.is_empty() {
        eprintln!("patchbay-gateway keys new: --id must not be empty");
        return ExitCode::from(crate::EXIT_CONFIG);
    }
    let mut bytes = [0u8; KEY_BYTES];
    if let Err(e) = getrandom::fill(&mut bytes) {
        eprintln!("patchbay-gateway keys new: no OS randomness: {e}");
        return ExitCode::FAILURE;
    }
    let key = format!("{KEY_PREFIX}{}", hex::encode(bytes));
    // The key on stdout's first line, the block after a blank line; what
    // to do with each goes to stderr, so a script can take the key with
    // `head -n 1`.
    eprintln!("The key (shown once; give it to the client), then the entry for the keys file:");
    let block = block(id, team, &Secret::new(key.as_str()));
    print!("{key}\n\n{block}");
    ExitCode::SUCCESS
}

/// The `[[keys]]` block for `key`.
fn block(id: &str, team: Option<&str>, key: &Secret) -> String {
    let mut entry = toml::Table::new();
    entry.insert("id".into(), id.into());
    entry.insert("sha256".into(), hex::encode(key.sha256()).into());
    if let Some(team) = team {
        entry.insert("team".into(), team.into());
    }
    let mut file = toml::Table::new();
    file.insert("keys".into(), toml::Value::Array(vec![entry.into()]));
    toml::to_string(&file).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use patchbay_gateway::auth::KeySet;

    #[test]
    fn the_block_is_a_keys_file_that_accepts_the_key() {
        let key = Secret::new("pb-0123");
        let text = block("svc \"a\"", Some("voice"), &key);
        let keys = KeySet::parse(&text).expect(&text);
        let entry = keys.lookup(&key).expect("the key is found");
        assert_eq!(entry.id, "svc \"a\"");
        assert_eq!(entry.team.as_deref(), Some("voice"));
    }
}
