# `sam build` (template.yaml: Metadata BuildMethod: makefile) runs one target
# per function; all six share the package that infra/build_lambda.sh builds.
.PHONY: build-ChatFunction build-ChatStreamFunction build-SessionsFunction build-ExportFunction build-CleanupFunction build-SummaryFunction
build-ChatFunction build-ChatStreamFunction build-SessionsFunction build-ExportFunction build-CleanupFunction build-SummaryFunction:
	bash infra/build_lambda.sh --no-zip --out "$(ARTIFACTS_DIR)"
