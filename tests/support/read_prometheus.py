"""Prints every sample of the Prometheus text files named, as the Prometheus client's own parser
reads them: one line per sample, `FILE<TAB>NAME{LABEL=VALUE,...}<TAB>VALUE`, labels sorted. A file
the parser refuses makes it exit 1 with the parser's message."""
import sys

from prometheus_client.parser import text_string_to_metric_families

for path in sys.argv[1:]:
    with open(path, encoding="utf-8") as file:
        text = file.read()
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError as error:
        print(f"{path}: not Prometheus's text format: {error}", file=sys.stderr)
        sys.exit(1)
    for family in families:
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            value = int(sample.value) if float(sample.value).is_integer() else sample.value
            print(f"{path}\t{sample.name}{{{labels}}}\t{value}")
