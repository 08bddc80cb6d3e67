//! The text format's fields and timestamp, written without the formatting
//! machinery `tracing-subscriber`'s defaults go through: every session's
//! `session ended` line paid ~1,000 instructions a field (three nested
//! `write!`s, two of them painting with empty ANSI styles) and ~4,500 for
//! the clock (a `DateTime` rendered through seven padded integers).
//!
//! The text is the defaults' own, byte for byte (the tests compare them):
//! [`PlainFields`] writes `name=value` as [`DefaultFields`] does without
//! colours, and hands every case it does not write itself to
//! [`DefaultVisitor`] — the message (which that visitor sanitises), errors,
//! and every field when the writer paints (a terminal). [`UtcMicros`]
//! writes the time as [`SystemTime`] does (`2026-12-02T03:24:00.123456Z`),
//! and leaves years before 1970 or after 9999 to it.
//!
//! [`DefaultFields`]: tracing_subscriber::fmt::format::DefaultFields
//! [`SystemTime`]: tracing_subscriber::fmt::time::SystemTime

use std::fmt;

use tracing::field::{Field, Visit};
use tracing_subscriber::field::{MakeVisitor, VisitFmt, VisitOutput};
use tracing_subscriber::fmt::format::{DefaultVisitor, Writer};
use tracing_subscriber::fmt::time::FormatTime;

/// The text format's field formatter; see the module docs.
#[derive(Debug, Clone, Copy, Default)]
pub struct PlainFields;

impl<'a> MakeVisitor<Writer<'a>> for PlainFields {
    type Visitor = PlainVisitor<'a>;

    fn make_visitor(&self, writer: Writer<'a>) -> Self::Visitor {
        PlainVisitor {
            plain: !writer.has_ansi_escapes(),
            writer,
            is_empty: true,
            result: Ok(()),
        }
    }
}

pub struct PlainVisitor<'a> {
    writer: Writer<'a>,
    /// The writer does not paint: fields are written here.
    plain: bool,
    is_empty: bool,
    result: fmt::Result,
}

impl PlainVisitor<'_> {
    /// Writes `name=` (after a space unless it is the first field) and
    /// returns true, or returns false when the field is not written here:
    /// the message, a `log.` field (which the default skips), a painting
    /// writer, or an earlier error.
    fn start(&mut self, field: &Field) -> bool {
        let name = field.name();
        if !self.plain || self.result.is_err() || name == "message" || name.starts_with("log.") {
            return false;
        }
        let name = name.strip_prefix("r#").unwrap_or(name);
        let pad = if std::mem::take(&mut self.is_empty) {
            ""
        } else {
            " "
        };
        self.result = self
            .writer
            .write_str(pad)
            .and_then(|()| self.writer.write_str(name))
            .and_then(|()| self.writer.write_char('='));
        self.result.is_ok()
    }

    /// What the default visitor writes for `field` (nothing for a `log.`
    /// field, which it skips without padding).
    fn default(&mut self, field: &Field, record: impl FnOnce(&mut DefaultVisitor<'_>)) {
        if self.result.is_err() || field.name().starts_with("log.") {
            return;
        }
        let mut inner = DefaultVisitor::new(self.writer.by_ref(), self.is_empty);
        record(&mut inner);
        self.result = inner.finish();
        self.is_empty = false;
    }
}

impl Visit for PlainVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if !self.start(field) {
            return self.default(field, |d| d.record_str(field, value));
        }
        self.result = if value
            .bytes()
            .all(|b| (b' '..=b'~').contains(&b) && b != b'"' && b != b'\\')
        {
            // `{:?}` of a string of printable ASCII without quotes or
            // backslashes is the string in quotes.
            self.writer
                .write_char('"')
                .and_then(|()| self.writer.write_str(value))
                .and_then(|()| self.writer.write_char('"'))
        } else {
            write!(self.writer, "{value:?}")
        };
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        if !self.start(field) {
            return self.default(field, |d| d.record_u64(field, value));
        }
        self.result = self.writer.write_str(itoa::Buffer::new().format(value));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        if !self.start(field) {
            return self.default(field, |d| d.record_i64(field, value));
        }
        self.result = self.writer.write_str(itoa::Buffer::new().format(value));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        if !self.start(field) {
            return self.default(field, |d| d.record_bool(field, value));
        }
        self.result = self.writer.write_str(if value { "true" } else { "false" });
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.default(field, |d| d.record_error(field, value));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if !self.start(field) {
            return self.default(field, |d| d.record_debug(field, value));
        }
        self.result = write!(self.writer, "{value:?}");
    }
}

impl VisitOutput<fmt::Result> for PlainVisitor<'_> {
    fn finish(self) -> fmt::Result {
        self.result
    }
}

impl VisitFmt for PlainVisitor<'_> {
    fn writer(&mut self) -> &mut dyn fmt::Write {
        &mut self.writer
    }
}

/// The text format's timestamp; see the module docs.
#[derive(Debug, Clone, Copy, Default)]
pub struct UtcMicros;

impl FormatTime for UtcMicros {
    fn format_time(&self, w: &mut Writer<'_>) -> fmt::Result {
        let now = std::time::SystemTime::now();
        match now
            .duration_since(std::time::UNIX_EPOCH)
            .ok()
            .and_then(|d| rfc3339_micros(d.as_secs(), d.subsec_micros()))
        {
            Some(text) => w.write_str(std::str::from_utf8(&text).map_err(|_| fmt::Error)?),
            None => tracing_subscriber::fmt::time::SystemTime.format_time(w),
        }
    }
}

/// `YYYY-MM-DDTHH:MM:SS.ffffffZ` for `secs` after the Unix epoch, or `None`
/// past the year 9999.
fn rfc3339_micros(secs: u64, micros: u32) -> Option<[u8; 27]> {
    let days = secs / 86_400;
    let rem = secs % 86_400;
    let (year, month, day) = civil_from_days(days);
    if year > 9999 {
        return None;
    }
    let mut out = *b"0000-00-00T00:00:00.000000Z";
    put(&mut out[0..4], year);
    put(&mut out[5..7], month);
    put(&mut out[8..10], day);
    put(&mut out[11..13], rem / 3600);
    put(&mut out[14..16], rem % 3600 / 60);
    put(&mut out[17..19], rem % 60);
    put(&mut out[20..26], u64::from(micros));
    Some(out)
}

/// Writes `n`'s last `digits.len()` decimal digits, zero-padded.
fn put(digits: &mut [u8], mut n: u64) {
    for d in digits.iter_mut().rev() {
        *d = b'0' + (n % 10) as u8;
        n /= 10;
    }
}

/// The proleptic Gregorian date `days` after 1970-01-01 (H. Hinnant's
/// `civil_from_days`, for days on or after the epoch).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::{Arc, Mutex};

    use tracing_subscriber::fmt::format::DefaultFields;
    use tracing_subscriber::fmt::MakeWriter;
    use tracing_subscriber::layer::SubscriberExt;

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Captured {
        type Writer = Captured;

        fn make_writer(&'a self) -> Self::Writer {
            self.clone()
        }
    }

    impl Captured {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    #[derive(Debug)]
    struct Odd;

    impl fmt::Display for Odd {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("odd \"display\"\n")
        }
    }

    #[derive(Debug)]
    struct Failure;

    impl fmt::Display for Failure {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("it broke")
        }
    }

    impl std::error::Error for Failure {}

    /// Every kind of field the gateway's events carry, and the odd ones.
    fn events() {
        let r#type = "keyword";
        let err: &(dyn std::error::Error + 'static) = &Failure;
        tracing::info!(
            session_id = %"sess_0123",
            key_id = %Odd,
            client_secret_id = None::<&str>,
            model = "gpt-realtime",
            duration_ms = 1234_u64,
            setup_ms = Some(0.25_f64),
            outcome = "client_closed",
            client_close_code = Some(1000_u16),
            upstream_close_code = None::<u16>,
            negative = -7_i64,
            flag = true,
            big = u128::MAX,
            r#type,
            quoted = "say \"hi\"\\ \t\n é \u{7f}",
            empty = "",
            debug = ?vec![1, 2],
            error = err,
            "session ended"
        );
        tracing::warn!(only = 1_u64);
        tracing::info!("message only with \x1b[31m escape");
        tracing::info!(first = "a", "message {} after a field", 2);
    }

    fn capture(ansi: bool, plain: bool) -> String {
        let out = Captured::default();
        let layer = tracing_subscriber::fmt::layer()
            .with_ansi(ansi)
            .without_time()
            .with_writer(out.clone());
        let subscriber = tracing_subscriber::registry();
        if plain {
            let s = subscriber.with(layer.fmt_fields(PlainFields));
            tracing::subscriber::with_default(s, events);
        } else {
            let s = subscriber.with(layer.fmt_fields(DefaultFields::new()));
            tracing::subscriber::with_default(s, events);
        }
        out.text()
    }

    #[test]
    fn fields_are_written_as_the_default_writes_them() {
        for ansi in [false, true] {
            let plain = capture(ansi, true);
            let default = capture(ansi, false);
            assert_eq!(plain, default, "ansi {ansi}");
            // Four events, the first with a newline in a displayed value.
            assert_eq!(plain.lines().count(), 5, "{plain}");
        }
        // The plain text really is plain, and says what it should.
        let text = capture(false, true);
        assert!(
            text.contains(
                "session ended session_id=sess_0123 key_id=odd \"display\"\n model=\"gpt-realtime\" \
                 duration_ms=1234 setup_ms=0.25 outcome=\"client_closed\" client_close_code=1000 \
                 negative=-7 flag=true"
            ),
            "{text}"
        );
        assert!(!text.contains('\x1b'), "{text}");
    }

    #[test]
    fn the_time_is_written_as_the_default_writes_it() {
        for (secs, micros, text) in [
            (0, 0, "1970-01-01T00:00:00.000000Z"),
            (951_782_400, 7, "2000-02-29T00:00:00.000007Z"),
            (951_868_799, 999_999, "2000-02-29T23:59:59.999999Z"),
            (4_107_542_400, 0, "2100-03-01T00:00:00.000000Z"),
            (1_796_181_840, 123_456, "2026-12-02T03:24:00.123456Z"),
            (253_402_300_799, 0, "9999-12-31T23:59:59.000000Z"),
        ] {
            let got = rfc3339_micros(secs, micros).unwrap();
            assert_eq!(std::str::from_utf8(&got).unwrap(), text);
        }
        assert_eq!(rfc3339_micros(253_402_300_800, 0), None);

        // Against the default's own clock: the two reads agree to the
        // second unless a second ended between them (then read again).
        let write = |t: &dyn FormatTime| {
            let mut s = String::new();
            t.format_time(&mut Writer::new(&mut s)).unwrap();
            s
        };
        let agreed = (0..5).any(|_| {
            let ours = write(&UtcMicros);
            let theirs = write(&tracing_subscriber::fmt::time::SystemTime);
            assert_eq!(ours.len(), theirs.len(), "{ours} {theirs}");
            ours[..19] == theirs[..19]
        });
        assert!(agreed);
    }
}
