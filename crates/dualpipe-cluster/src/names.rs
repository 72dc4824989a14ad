//! Names the user gives to nodes and jobs, checked at input: they flow into tables, pictures,
//! placements and Kubernetes manifests, so a name that could rewrite a terminal line, reorder
//! text or name another path is refused where it is read, naming the field.

/// Whether `c` is a Unicode format character (general category Cf): invisible characters that
/// change how text around them is shown (bidirectional overrides, zero-width joiners, soft
/// hyphens, tags).
pub fn is_format_char(c: char) -> bool {
    matches!(
        c as u32,
        0x00AD
            | 0x0600..=0x0605
            | 0x061C
            | 0x06DD
            | 0x070F
            | 0x0890..=0x0891
            | 0x08E2
            | 0x180E
            | 0x200B..=0x200F
            | 0x202A..=0x202E
            | 0x2060..=0x2064
            | 0x2066..=0x206F
            | 0xFEFF
            | 0xFFF9..=0xFFFB
            | 0x110BD
            | 0x110CD
            | 0x13430..=0x1343F
            | 0x1BCA0..=0x1BCA3
            | 0x1D173..=0x1D17A
            | 0xE0001
            | 0xE0020..=0xE007F
    )
}

/// Checks a node or job name: non-empty, no control or format character, no `/` and no `..`.
/// The error says what is wrong (the caller adds the field or line).
///
/// ```
/// use dualpipe_cluster::names::check_name;
/// assert!(check_name("gpu-node-0").is_ok());
/// assert!(check_name("../../x").is_err());
/// assert!(check_name("a\u{1b}[31m").is_err());
/// assert!(check_name("evil\u{202e}gnp").is_err());
/// ```
pub fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("an empty name; give a name".into());
    }
    if let Some(c) = name.chars().find(|&c| c.is_control() || is_format_char(c)) {
        return Err(format!(
            "the name {name:?} holds the control or format character U+{:04X}; give printable \
             characters",
            c as u32
        ));
    }
    if name.contains('/') || name.contains("..") {
        return Err(format!(
            "the name {name:?} holds `/` or `..`; give a plain name (letters, digits, `-`, `_`, `.`)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_names_are_refused_and_plain_ones_kept() {
        for bad in [
            "a\u{1b}[31m\nb",
            "../../x",
            "n\"]}\n  evil: true #",
            "j\u{0}0",
            "a\u{200b}b",
            "x/y",
            "",
        ] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        for good in ["node", "gpu-a.b_c", "é-node", "j0", "a b"] {
            check_name(good).unwrap();
        }
    }

    #[test]
    fn cluster_files_and_traces_refuse_them_naming_the_field_or_line() {
        let cluster = |name: &str| {
            format!(
                r#"{{"links": {{"intra_node": {{"latency": 0, "bandwidth": 1e9}},
                "inter_node": {{"latency": 0, "bandwidth": 1e9}},
                "inter_datacenter": {{"latency": 0, "bandwidth": 1e9}}}},
                "nodes": [{{"name": {}, "devices": 8, "memory": 8e10}}]}}"#,
                serde_json::to_string(name).unwrap()
            )
        };
        crate::Cluster::from_json(&cluster("node")).unwrap();
        for bad in ["a\u{1b}[31m\nb", "../../x", "evil\u{202e}x"] {
            let err = crate::Cluster::from_json(&cluster(bad))
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("nodes[0].name") && !err.contains('\n'),
                "{err}"
            );
        }
        let head = "job,arrival_s,gpus,duration_s\n";
        crate::parse_trace(&format!("{head}j0,0,1,100\n")).unwrap();
        // A byte-order mark at the start of the file is not part of a name.
        crate::parse_trace(&format!("\u{feff}{head}j0,0,1,100\n")).unwrap();
        for bad in ["a\u{1b}[31mred", "j\u{0}0", "../j"] {
            let err = crate::parse_trace(&format!("{head}{bad},0,1,100\n"))
                .unwrap_err()
                .to_string();
            assert!(err.contains("line 2: job:"), "{err}");
        }
    }
}
