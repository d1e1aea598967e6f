"""Studies: orchestration that launches a sweep's runs (sweep/) and reads them back (compare/) to decide what runs
next or what they measured: seeds until decided (until_decided.py). A study returns values and reports progress
through callbacks; it prints nothing and picks no exit code (its CLI does), and nothing below it imports it."""
