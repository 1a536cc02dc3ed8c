//! Canonical JSON for signed metadata: keys sorted, no insignificant whitespace, integers only.
//! Written by hand rather than trusting `serde_json::Value`'s map order, which a
//! `preserve_order` feature anywhere in the build would silently change; floats are refused
//! because they do not survive a trip through the receipt log byte for byte.

use serde_json::Value;

use super::model::ReceiptError;
use super::{MAX_METADATA_BYTES, MAX_METADATA_DEPTH};

pub fn canonical_json(value: &Value) -> Result<String, ReceiptError> {
    let mut out = String::new();
    write_value(value, 0, &mut out)?;
    if out.len() > MAX_METADATA_BYTES {
        return Err(ReceiptError::TooLarge {
            what: "metadata",
            bytes: out.len(),
            max: MAX_METADATA_BYTES,
        });
    }
    Ok(out)
}

fn write_value(value: &Value, depth: usize, out: &mut String) -> Result<(), ReceiptError> {
    if depth > MAX_METADATA_DEPTH {
        return Err(ReceiptError::Metadata(format!(
            "nested deeper than {MAX_METADATA_DEPTH}"
        )));
    }
    if out.len() > MAX_METADATA_BYTES {
        return Err(ReceiptError::TooLarge {
            what: "metadata",
            bytes: out.len(),
            max: MAX_METADATA_BYTES,
        });
    }
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => {
            if n.is_u64() || n.is_i64() {
                out.push_str(&n.to_string());
            } else {
                return Err(ReceiptError::Metadata(format!(
                    "number {n} is not an integer"
                )));
            }
        }
        Value::String(s) => write_string(s, out)?,
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(item, depth + 1, out)?;
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(key, out)?;
                out.push(':');
                if let Some(item) = map.get(key) {
                    write_value(item, depth + 1, out)?;
                }
            }
            out.push('}');
        }
    }
    Ok(())
}

fn write_string(s: &str, out: &mut String) -> Result<(), ReceiptError> {
    let quoted = serde_json::to_string(s).map_err(|e| ReceiptError::Metadata(e.to_string()))?;
    out.push_str(&quoted);
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn keys_are_sorted_at_every_level() {
        let value = json!({"b": 1, "a": {"z": [true, null], "y": "s\"q"}, "c": -3});
        assert_eq!(
            canonical_json(&value).expect("canonical"),
            r#"{"a":{"y":"s\"q","z":[true,null]},"b":1,"c":-3}"#
        );
    }

    #[test]
    fn floats_depth_and_size_are_refused() {
        assert!(canonical_json(&json!({"x": 1.5})).is_err());
        let mut deep = json!(1);
        for _ in 0..=MAX_METADATA_DEPTH {
            deep = json!([deep]);
        }
        assert!(canonical_json(&deep).is_err());
        let big = json!({"x": "y".repeat(MAX_METADATA_BYTES)});
        assert!(matches!(
            canonical_json(&big),
            Err(ReceiptError::TooLarge { .. })
        ));
    }
}
