//! The query of a request (percent-decoded), and the label and field selectors of lists
//! and watches.

use serde_json::Value;

/// `k=v&...` of a URI, each part percent-decoded (`+` is a space).
pub(super) fn parse_query(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect()
}

fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => match bytes.get(i + 1..i + 3) {
                Some(&[h, l]) if h.is_ascii_hexdigit() && l.is_ascii_hexdigit() => {
                    let hex = |c: u8| (c as char).to_digit(16).unwrap_or(0) as u8;
                    out.push((hex(h) << 4) | hex(l));
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// One requirement of a selector.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A label selector (`app=x,tier!=db,env in (a,b),!legacy`) or a field selector
/// (`spec.nodeName=n,metadata.name!=x`); empty: everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Selector(Vec<Requirement>);

impl Selector {
    /// A label selector; `Err`: what is wrong with it.
    pub fn labels(s: &str) -> Result<Self, String> {
        split_terms(s)
            .into_iter()
            .map(|t| label_term(&t).ok_or_else(|| format!("invalid label selector term {t:?}")))
            .collect::<Result<_, _>>()
            .map(Self)
    }

    /// A field selector (only `=`, `==` and `!=`); `Err`: what is wrong with it.
    pub fn fields(s: &str) -> Result<Self, String> {
        split_terms(s)
            .into_iter()
            .map(|t| match equality(&t) {
                Some(r @ (Requirement::Equals(..) | Requirement::NotEquals(..))) => Ok(r),
                _ => Err(format!("invalid field selector term {t:?}")),
            })
            .collect::<Result<_, _>>()
            .map(Self)
    }

    /// Whether `object`'s labels match.
    pub fn matches_labels(&self, object: &Value) -> bool {
        let labels = &object["metadata"]["labels"];
        self.matches(|k| labels.get(k).map(text))
    }

    /// Whether `object`'s fields (dotted paths into it) match; a missing field is `""`.
    pub fn matches_fields(&self, object: &Value) -> bool {
        self.matches(|path| {
            let v = path.split('.').try_fold(object, |v, k| v.get(k));
            Some(v.map(text).unwrap_or_default())
        })
    }

    fn matches(&self, get: impl Fn(&str) -> Option<String>) -> bool {
        self.0.iter().all(|r| match r {
            Requirement::Equals(k, v) => get(k).as_ref() == Some(v),
            Requirement::NotEquals(k, v) => get(k).as_ref() != Some(v),
            Requirement::In(k, vs) => get(k).is_some_and(|x| vs.contains(&x)),
            Requirement::NotIn(k, vs) => get(k).is_none_or(|x| !vs.contains(&x)),
            Requirement::Exists(k) => get(k).is_some(),
            Requirement::NotExists(k) => get(k).is_none(),
        })
    }
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// The comma-separated terms of a selector, commas inside `( )` kept.
fn split_terms(s: &str) -> Vec<String> {
    let mut terms = vec![];
    let mut depth = 0_usize;
    let mut current = String::new();
    for c in s.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                terms.push(std::mem::take(&mut current));
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    terms.push(current);
    terms
        .into_iter()
        .map(|t| t.trim().to_owned())
        .filter(|t| !t.is_empty())
        .collect()
}

fn equality(t: &str) -> Option<Requirement> {
    let (req, k, v): (fn(String, String) -> Requirement, _, _) =
        if let Some((k, v)) = t.split_once("!=") {
            (Requirement::NotEquals, k, v)
        } else if let Some((k, v)) = t.split_once("==") {
            (Requirement::Equals, k, v)
        } else {
            let (k, v) = t.split_once('=')?;
            (Requirement::Equals, k, v)
        };
    let k = k.trim();
    (!k.is_empty()).then(|| req(k.to_owned(), v.trim().to_owned()))
}

fn label_term(t: &str) -> Option<Requirement> {
    if let Some(k) = t.strip_prefix('!') {
        return Some(Requirement::NotExists(k.trim().to_owned()));
    }
    for (op, req) in [
        (
            " notin ",
            Requirement::NotIn as fn(String, Vec<String>) -> Requirement,
        ),
        (" in ", Requirement::In),
    ] {
        if let Some((k, set)) = t.split_once(op) {
            let set = set.trim().strip_prefix('(')?.strip_suffix(')')?;
            let values = set.split(',').map(|v| v.trim().to_owned()).collect();
            return Some(req(k.trim().to_owned(), values));
        }
    }
    if t.contains('=') {
        return equality(t);
    }
    Some(Requirement::Exists(t.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn queries_are_percent_decoded() {
        assert_eq!(
            parse_query("&fieldSelector=spec.nodeName%3Dnode-a&labelSelector=a+in+(b%2Cc)&watch"),
            [
                ("fieldSelector".into(), "spec.nodeName=node-a".into()),
                ("labelSelector".into(), "a in (b,c)".into()),
                ("watch".into(), String::new()),
            ]
        );
        assert_eq!(decode("100%"), "100%");
        assert_eq!(decode("%zz"), "%zz");
    }

    #[test]
    fn selectors_match_labels_and_fields() {
        let o = json!({"metadata": {"name": "p", "labels": {"app": "x", "tier": "web"}},
                       "spec": {"nodeName": "n1", "replicas": 2}});
        let labels = |s: &str| Selector::labels(s).unwrap().matches_labels(&o);
        assert!(labels(""));
        assert!(labels("app=x,tier!=db"));
        assert!(labels("app==x"));
        assert!(labels("tier in (web, api),env notin (prod)"));
        assert!(labels("app,!env"));
        assert!(!labels("app=y"));
        assert!(!labels("env"));
        assert!(!labels("tier notin (web)"));
        let fields = |s: &str| Selector::fields(s).unwrap().matches_fields(&o);
        assert!(fields("spec.nodeName=n1,metadata.name!=q"));
        assert!(fields("spec.replicas=2"));
        assert!(fields("spec.missing="));
        assert!(!fields("spec.nodeName=n2"));
        assert!(Selector::fields("a in (b)").is_err());
        assert!(Selector::labels("a in b").is_err());
    }
}
