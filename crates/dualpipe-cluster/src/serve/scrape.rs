//! Reading a job's Prometheus text page (the scheduler's scrapes).

/// The value of the sample `name` (without labels) in a Prometheus text page, if present
/// and a number.
pub fn sample(page: &str, name: &str) -> Option<f64> {
    page.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let rest = l.strip_prefix(name)?;
        let value = rest.strip_prefix(' ')?;
        value.split_whitespace().next()?.parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_found_by_exact_name() {
        let page = "# HELP dualpipe_loss x\ndualpipe_loss_scale 3\ndualpipe_loss 0.25\ndualpipe_steps_total 7\n";
        assert_eq!(sample(page, "dualpipe_loss"), Some(0.25));
        assert_eq!(sample(page, "dualpipe_steps_total"), Some(7.0));
        assert_eq!(sample(page, "dualpipe_tokens_total"), None);
    }
}
