"""Every test of the build has exactly one tier label (tests/CMakeLists.txt).

check_tiers.py <ctest> <tier>...   (run in the build directory)
"""
import json
import subprocess
import sys

ctest, tiers = sys.argv[1], set(sys.argv[2:])
listing = json.loads(subprocess.run([ctest, "--show-only=json-v1"], check=True, capture_output=True,
                                    text=True).stdout)
wrong = []
counts = {tier: 0 for tier in sorted(tiers)}
for test in listing["tests"]:
    # A test program not built yet stands in as one placeholder (catch_discover_tests).
    if test["name"].endswith("_NOT_BUILT"):
        continue
    labels = next((p["value"] for p in test.get("properties", []) if p["name"] == "LABELS"), [])
    in_tiers = [label for label in labels if label in tiers]
    if len(in_tiers) != 1:
        wrong.append(f"{test['name']}: tiers {in_tiers or 'none'}")
    else:
        counts[in_tiers[0]] += 1
print(", ".join(f"{count} {tier}" for tier, count in counts.items()))
if wrong:
    print(f"{len(wrong)} tests without exactly one tier label:", *wrong[:50], sep="\n  ")
    sys.exit(1)
