# `sam build` (template.yaml: Metadata BuildMethod: makefile) runs one target
# per function; all four share the package that infra/build_lambda.sh builds.
.PHONY: build-ChatFunction build-SessionsFunction build-ExportFunction build-CleanupFunction
build-ChatFunction build-SessionsFunction build-ExportFunction build-CleanupFunction:
	bash infra/build_lambda.sh --no-zip --out "$(ARTIFACTS_DIR)"
