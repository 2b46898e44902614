/*
 * InstalledSmoke.java - run against the installed jar only (java -cp <prefix>/share/java/conflux.jar
 * InstalledSmoke.java): the jar must find its installed libconflux_jni.so and allreduce must work.
 */
import org.conflux.Conflux;
import org.conflux.ReduceOp;

public final class InstalledSmoke {
    public static void main(String[] args) {
        try (Conflux cfx = Conflux.init(new Conflux.Options().transport(Conflux.Transport.LOCAL))) {
            double[] x = {1.5, -2};
            cfx.allreduce("smoke", x, ReduceOp.SUM);
            String where = org.conflux.Conflux.class.getProtectionDomain().getCodeSource().getLocation().getPath();
            if (cfx.size() != 1 || x[0] != 1.5 || x[1] != -2) {
                throw new AssertionError("unexpected result");
            }
            System.out.println("installed jar ok: " + where + ", version " + Conflux.version());
        }
    }
}
