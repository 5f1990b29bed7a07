"""A throwaway PKI for the TLS tests: a CA and certificates made with the
openssl command line, in a directory of the test's."""

import os
import subprocess


def openssl(*args: str, cwd: str) -> None:
    subprocess.run(["openssl", *args], check=True, cwd=cwd, capture_output=True)


def leaf(cwd: str, name: str, san: str, ca: str = "ca") -> None:
    """`name.crt`/`name.key` signed by `ca`, with the subjectAltName `san`."""
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=cwd)
    with open(os.path.join(cwd, f"{name}.ext"), "w") as f:
        f.write(f"subjectAltName={san}\n")
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
            "-CAcreateserial", "-days", "1", "-out", f"{name}.crt", "-extfile", f"{name}.ext", cwd=cwd)


def make_ca(cwd: str, name: str = "ca") -> None:
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", f"{name}.key", "-out", f"{name}.crt", "-days", "1", "-subj", f"/CN={name}", cwd=cwd)
