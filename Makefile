# The README's two commands are `make demo` and `make test`; each installs what is missing first.
PY ?= .venv/bin/python

.PHONY: install test demo bench clean

install:
	bash ci/install_system.sh
	bash ci/install_python.sh

test: install
	bash ci/run_tests.sh

demo: install
	bash ci/demo.sh

bench: install
	$(PY) -m horovod_gradcomp.bench codecs

clean:
	rm -rf build horovod_gradcomp/_C*.so *.egg-info
