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
