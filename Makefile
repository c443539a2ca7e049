# The README's two commands are `make demo` and `make test`; each installs what is missing first.
# `make test` also builds the OpenMP twin of the device kernels (a test-time build, `make twin`).
PY ?= .venv/bin/python

.PHONY: install twin test demo bench docs clean

install:
	bash ci/install_system.sh
	bash ci/install_python.sh

twin: install
	bash ci/build_twin.sh

test: install
	bash ci/run_tests.sh

# The demo needs neither the test nor the docs tools: `make test` and `make docs` add them.
demo:
	bash ci/install_system.sh
	HGC_INSTALL_EXTRAS=0 bash ci/install_python.sh
	bash ci/demo.sh

bench: install
	$(PY) -m horovod_gradcomp.bench codecs

# The user guide (mkdocs.yml, docs/) into site/; --strict fails on a broken link or a missing page.
docs: install
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict -d site

clean:
	rm -rf build horovod_gradcomp/_C*.so *.egg-info
