//! The two Prometheus exposition formats of one metrics page.
//!
//! The daemons encode their registries in OpenMetrics 1.0 (`prometheus-client`'s only
//! format). Prometheus asks for it in its `Accept` header and gets it; every other reader
//! (`curl`, `promtool check metrics`, older scrapers) gets the classic text format 0.0.4,
//! converted here: a counter family's `HELP` and `TYPE` name its `_total` samples, an info
//! family becomes a gauge named after its `_info` samples, `unknown` is `untyped`, and the
//! `UNIT` lines and the `# EOF` end marker (which 0.0.4 does not have) are left out.
//! Samples are the same lines in both.

/// Content type of an OpenMetrics page.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// Content type of a text format 0.0.4 page.
pub const TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Whether a request with this `Accept` header takes OpenMetrics.
pub fn wants_openmetrics(accept: Option<&str>) -> bool {
    accept.is_some_and(|a| a.contains("application/openmetrics-text"))
}

/// The page for a request with this `Accept` header: its content type and body, from the
/// OpenMetrics page `openmetrics`.
pub fn negotiate(accept: Option<&str>, openmetrics: String) -> (&'static str, String) {
    if wants_openmetrics(accept) {
        (OPENMETRICS, openmetrics)
    } else {
        (TEXT, to_text(&openmetrics))
    }
}

/// The text format 0.0.4 of an OpenMetrics page (see the module documentation).
pub fn to_text(openmetrics: &str) -> String {
    use std::collections::HashMap;
    // Family name -> its name in 0.0.4 and its type there, from the TYPE lines.
    let mut families: HashMap<&str, (String, &str)> = HashMap::new();
    for line in openmetrics.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let Some((name, kind)) = rest.split_once(' ') else {
            continue;
        };
        let renamed = match kind {
            "counter" => (format!("{name}_total"), "counter"),
            "info" => (format!("{name}_info"), "gauge"),
            "unknown" => (name.to_owned(), "untyped"),
            other => (name.to_owned(), other),
        };
        families.insert(name, renamed);
    }
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            let name = families.get(name).map_or(name, |f| f.0.as_str());
            out.push_str("# HELP ");
            out.push_str(name);
            if !help.is_empty() {
                out.push(' ');
                out.push_str(help);
            }
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let name = rest.split_once(' ').map_or(rest, |(n, _)| n);
            match families.get(name) {
                Some((renamed, kind)) => {
                    out.push_str("# TYPE ");
                    out.push_str(renamed);
                    out.push(' ');
                    out.push_str(kind);
                }
                None => out.push_str(line),
            }
        } else {
            out.push_str(line);
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = "\
# HELP app_requests Requests by result.
# TYPE app_requests counter
app_requests_total{result=\"ok\"} 3
# HELP app_used_bytes Bytes in use.
# TYPE app_used_bytes gauge
# UNIT app_used_bytes bytes
app_used_bytes 10
# HELP app_build Build.
# TYPE app_build info
app_build_info{version=\"1\"} 1
# HELP app_seconds Time.
# TYPE app_seconds histogram
app_seconds_bucket{le=\"+Inf\"} 1
app_seconds_sum 0.5
app_seconds_count 1
# EOF
";

    #[test]
    fn counters_and_infos_are_named_after_their_samples() {
        let text = to_text(PAGE);
        for want in [
            "# HELP app_requests_total Requests by result.",
            "# TYPE app_requests_total counter",
            "app_requests_total{result=\"ok\"} 3",
            "# TYPE app_used_bytes gauge",
            "# HELP app_build_info Build.",
            "# TYPE app_build_info gauge",
            "# TYPE app_seconds histogram",
            "app_seconds_count 1",
        ] {
            assert!(text.lines().any(|l| l == want), "{want:?} in\n{text}");
        }
        assert!(!text.contains("# EOF"), "{text}");
        assert!(!text.contains("# UNIT"), "{text}");
        assert!(!text.contains("# TYPE app_requests counter"), "{text}");
    }

    #[test]
    fn prometheus_gets_openmetrics_and_others_text() {
        let accept = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        let (ct, body) = negotiate(Some(accept), PAGE.to_owned());
        assert_eq!((ct, body.as_str()), (OPENMETRICS, PAGE));
        let (ct, body) = negotiate(None, PAGE.to_owned());
        assert_eq!(ct, TEXT);
        assert!(!body.contains("# EOF"));
        let (ct, _) = negotiate(Some("*/*"), PAGE.to_owned());
        assert_eq!(ct, TEXT);
    }
}
