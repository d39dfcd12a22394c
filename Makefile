# `sam build` (template.yaml: Metadata BuildMethod: makefile) runs one target
# per function; all six ship the same package, which infra/build_lambda.sh
# builds for the first and, with --reuse, copies for the others when its
# inputs (sources, the lock infra/lambda-constraints.txt, build script) have
# not changed since. samconfig.toml builds the functions one after another
# (parallel = false) so that the copies can be made.
REUSE_DIR := build/sam-package

.PHONY: build-ChatFunction build-ChatStreamFunction build-SessionsFunction build-ExportFunction build-CleanupFunction build-SummaryFunction
build-ChatFunction build-ChatStreamFunction build-SessionsFunction build-ExportFunction build-CleanupFunction build-SummaryFunction:
	bash infra/build_lambda.sh --no-zip --out "$(ARTIFACTS_DIR)" --reuse "$(REUSE_DIR)"

# The fast lane: lint, format check, types and the unit tests (pytest -m unit:
# no database, no servers), in the venv infra/test.sh uses. `bash infra/test.sh`
# runs everything. Extra pytest arguments: make test-fast PYTEST_ARGS="-k tokens".
.PHONY: test-fast
test-fast:
	bash -c 'set -euo pipefail; source infra/venv.sh test; \
	  .venv/bin/ruff check functions tests; \
	  .venv/bin/ruff format --check functions tests; \
	  .venv/bin/mypy; \
	  .venv/bin/python -m pytest -m unit -q $(PYTEST_ARGS)'
